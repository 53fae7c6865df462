"""How a running local deployment tells other processes (batchctl, tests) where it is.

``python -m infra.local`` writes ``<repo>/.local-state/endpoint.json`` while it runs and removes it
when it stops. ``BATCHAPI_LOCAL_STATE_DIR`` moves the directory (tests run their own deployment
beside a developer's ``make up`` this way).
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict

from infra import names

#: Overrides the state directory (default: <repo>/.local-state).
STATE_DIR_ENV = "BATCHAPI_LOCAL_STATE_DIR"
#: The state directory again, in each engine's environment (which holds no BATCHAPI_ setting): only
#: names the deployment that started it, so its processes can be found (and none left running).
ENGINE_MARK_ENV = "LOCAL_BATCH_DEPLOYMENT"
#: moto accepts any credentials; the deployment and batchctl use these so they share one account.
REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"

REPO_ROOT = Path(__file__).resolve().parents[2]


class LocalState(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    moto_endpoint: str
    api_base_url: str
    table_name: str
    bucket_name: str
    region: str = REGION
    pid: int
    #: The audit queue, the Object Lock bucket of the chains' anchors and the public key of the
    #: checkpoints' signatures (docs/audit.md); empty with governance off.
    audit_queue_url: str = ""
    audit_bucket_name: str = ""
    audit_public_key_file: str = ""

    def write(self, path: Path) -> None:
        """Write atomically: a reader sees the old file, no file, or the whole new one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.model_dump_json(indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def read(cls, path: Path) -> Self | None:
        """The state at ``path``, or None if there is none (or it is unreadable)."""
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None


def state_file(directory: str | None) -> Path:
    """The state file in ``directory`` (None or empty: <repo>/.local-state)."""
    return Path(directory or REPO_ROOT / names.LOCAL_STATE_DIR) / names.LOCAL_STATE_FILE


def state_path(env: Mapping[str, str]) -> Path:
    return state_file(env.get(STATE_DIR_ENV))
