"""The upload assembler Lambda (docs/uploads.md): fed by the assembly queue, one completed Upload
per message; streams its parts into the File's object, checks the md5, marks the File processed.
Its last delivery that fails marks the File ``error`` instead of leaving it ``uploaded``."""

import json
from typing import Any

from aws_lambda_powertools import Logger

from functions.api import uploads
from functions.core import deps, limits

logger = Logger(service="batch-api-assembler")


def handle(body: str, receives: int) -> None:
    message = json.loads(body)
    tenant, upload_id = message["tenant"], message["upload_id"]
    try:
        done = uploads.assemble(deps.stores(), tenant, upload_id, now=deps.now())
    except Exception as exc:
        if receives < limits.ASSEMBLER_MAX_RECEIVES:
            raise
        logger.exception("assembly gave up", extra={"tenant": tenant, "upload_id": upload_id, "receives": receives})
        uploads.give_up(deps.stores(), tenant, upload_id, f"{type(exc).__name__}", now=deps.now())
        return
    logger.info(
        "assembled",
        extra={
            "tenant": tenant,
            "upload_id": upload_id,
            "outcome": done.outcome,
            "file_id": done.file_id,
            "bytes": done.bytes,
        },
    )


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    failures = []
    for record in event.get("Records", []):
        try:
            handle(record["body"], int(record.get("attributes", {}).get("ApproximateReceiveCount", 1)))
        except Exception:
            logger.exception("assembly failed; the message will be retried", extra={"message_id": record["messageId"]})
            failures.append({"itemIdentifier": record["messageId"]})
    return {"batchItemFailures": failures}
