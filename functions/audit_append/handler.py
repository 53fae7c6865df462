"""The audit appender Lambda (functions/audit_append/logic.py), fed by the audit queue (FIFO,
grouped by tenant; partial batch failures: a failed intent and the ones after it of the same
tenant come back, other tenants' go on). After the batch, one signed checkpoint per tenant it
appended to; a checkpoint that cannot be written fails that tenant's last message, so its
redelivery (a duplicate) writes it."""

from typing import Any

from aws_lambda_powertools import Logger
from aws_lambda_powertools.utilities.batch import SqsFifoPartialProcessor, process_partial_response
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from pydantic import ValidationError

from functions.core import clients, deps
from functions.core.audit import AuditIntent
from functions.core.aws.audit import AuditRepo
from functions.core.aws.dynamodb import Table
from functions.core.aws.kms import KmsSigner
from functions.core.aws.s3 import WormObjects
from functions.core.ports import Signer
from functions.core.settings import Settings

from .logic import AppenderStores, Invocation

logger = Logger(service="batch-api-audit-append")
processor = SqsFifoPartialProcessor(skip_group_on_error=True)


def signer(settings: Settings) -> Signer:
    """The KMS key on AWS; the local deployment's key file where there is no KMS key."""
    if settings.audit_signing_key_id:
        return KmsSigner(clients.client("kms"), settings.audit_signing_key_id)
    if settings.audit_local_key_file:
        from functions.core.signing import FileSigner  # local only (needs `cryptography`)

        return FileSigner(settings.audit_local_key_file)
    raise RuntimeError("the audit appender has no signing key (audit_signing_key_id or audit_local_key_file)")


@deps.per_process
def appender_stores() -> AppenderStores:
    settings, stores = deps.settings(), deps.stores()
    return AppenderStores(
        chain=AuditRepo(Table(clients.dynamodb_table(settings.table_name))),
        worm=WormObjects(clients.client("s3"), settings.audit_bucket_name),
        signer=signer(settings),
        batches=stores.batches,
        objects=stores.objects,
    )


def _intent(body: str) -> AuditIntent | ValidationError:
    try:
        return AuditIntent.model_validate_json(body)
    except ValidationError as exc:
        return exc


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> PartialItemFailureResponse:
    run = Invocation(appender_stores(), now=deps.now)
    last: dict[str, str] = {}  # tenant -> the message id of its last intent taken
    # Every intent of the batch is taken first (a tenant's together: ``Invocation.take_all``); the
    # records then report each outcome, in order, so a failure fails the rest of its tenant's.
    parsed = {r["messageId"]: _intent(r["body"]) for r in event.get("Records", [])}
    valid = [(m, i) for m, i in parsed.items() if isinstance(i, AuditIntent)]
    outcomes = dict(zip([m for m, _ in valid], run.take_all([i for _, i in valid]), strict=True))

    def handle_record(record: SQSRecord) -> None:
        intent = parsed[record.message_id]
        if isinstance(intent, ValidationError):  # nothing to append; a retry cannot help
            logger.error("audit_intent_invalid", extra={"message_id": record.message_id, "error": str(intent)[:500]})
            return
        taken = outcomes[record.message_id]
        if isinstance(taken, Exception):
            raise taken
        extra = {
            "tenant": intent.tenant,
            "action": intent.action,
            "outcome": taken.outcome,
            "seq": taken.record.seq if taken.record else None,
        }
        if taken.outcome in ("refused", "conflict"):
            logger.error(f"audit_intent_{taken.outcome}", extra=extra | {"reason": taken.reason})
        elif taken.skipped:  # the table's tail was cut: the chain goes on after the copies
            logger.error("audit_tail_cut", extra=extra | {"skipped": list(taken.skipped)})
        else:
            logger.info("audit_intent", extra=extra)
        last[intent.tenant] = record.message_id

    response = process_partial_response(event=event, record_handler=handle_record, processor=processor, context=context)
    failures = response.setdefault("batchItemFailures", [])
    for tenant in run.heads:
        try:
            checkpoint = run.checkpoint(tenant)
        except Exception:
            logger.exception("audit_checkpoint_failed", extra={"tenant": tenant})
            if {"itemIdentifier": last[tenant]} not in failures:
                failures.append({"itemIdentifier": last[tenant]})
            continue
        if checkpoint is not None:
            logger.info("audit_checkpoint", extra={"tenant": tenant, "seq": checkpoint.seq})
    return response
