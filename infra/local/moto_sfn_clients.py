"""moto's Step Functions interpreter builds a new boto3 client for every task it runs
(``boto_client_for``: a Lambda task's client, an SDK integration's), and each reconcile tick of
an open batch runs two Lambda tasks (docs/lifecycle.md, "Lost signals"). With the clients kept,
one open batch cost the local deployment about 70 ms less CPU a tick, on the cores the engines
share (docs/local.md, "moto's Step Functions: a task's client built once"). It keeps one client per
(region, service, role, interception, moto port) (``install``): the same client moto would build,
built once. botocore clients are thread-safe; nothing about what a task does changes.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Any

from moto.core.models import botocore_stubber
from moto.settings import moto_server_port
from moto.stepfunctions.parser.asl.utils import boto_client

_installed = False
_PARSER = "moto.stepfunctions.parser"


def install() -> None:
    """Keep the clients moto's interpreter builds, in moto's module and in every module of its
    parser that imported the function (idempotent)."""
    global _installed
    if _installed:
        return
    build = boto_client.boto_client_for
    kept: dict[tuple[Any, ...], Any] = {}
    lock = threading.Lock()

    @functools.wraps(build)
    def keep(region: str, service: str, state_credentials: Any = None) -> Any:
        key = (
            region,
            service,
            getattr(state_credentials, "role_arn", state_credentials),
            botocore_stubber.enabled,  # in-process interception or the server: different endpoints
            moto_server_port(),
        )
        with lock:
            if key not in kept:
                kept[key] = build(region=region, service=service, state_credentials=state_credentials)
            return kept[key]

    boto_client.boto_client_for = keep  # moto's, patched for the local server only
    for name, module in list(sys.modules.items()):  # those that imported it by name already
        if name.startswith(_PARSER) and getattr(module, "boto_client_for", None) is build:
            module.boto_client_for = keep  # type: ignore[attr-defined]
    _installed = True
