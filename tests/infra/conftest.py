"""One CDK synth per test session: the app exactly as ``cdk synth`` builds it (cdk-nag on), with
no config, into a temporary cloud assembly. Every infra test reads this one result."""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk.assertions import Template  # noqa: E402

from infra.app import build  # noqa: E402
from infra.stack import BatchApiStack  # noqa: E402


@dataclass(frozen=True)
class Synth:
    stack: BatchApiStack
    template: Template
    #: The synthesized template as a dict (for checks aws_cdk.assertions cannot express).
    json: dict[str, Any]
    template_path: Path
    outdir: Path

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: r for k, r in self.json["Resources"].items() if r["Type"] == type_}

    def one(self, type_: str) -> tuple[str, dict[str, Any]]:
        found = self.resources(type_)
        assert len(found) == 1, f"expected one {type_}, found {sorted(found)}"
        return next(iter(found.items()))

    def logical_id(self, construct: Any) -> str:
        cfn = getattr(construct.node, "default_child", None) or construct
        return self.stack.resolve(self.stack.get_logical_id(cfn))


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    outdir = tmp_path_factory.mktemp("cdk.out")
    app, stack = build(outdir=str(outdir))
    # Raises (cdk-nag's ValidationFailed, listing the findings) if any finding is unacknowledged.
    assembly = app.synth()
    artifact = assembly.get_stack_by_name(stack.stack_name)
    path = Path(artifact.template_full_path)
    data = json.loads(path.read_text())
    return Synth(stack=stack, template=Template.from_json(data), json=data, template_path=path, outdir=outdir)
