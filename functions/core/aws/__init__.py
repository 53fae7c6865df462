"""The AWS adapters of the ports in ``functions.core.ports``, one module per service, and the
wiring that builds them from the deployment's settings. The only code that touches boto3 (with
``functions.core.clients``, which makes the clients)."""

import functools

from .. import clients
from ..ports import Stores
from ..settings import Settings
from ..tenants import TenantPolicy
from .dynamodb import Table
from .eventbridge import EventBridge
from .repos import BatchRepo, FileRepo, KeyRepo, UploadRepo
from .s3 import ObjectStore
from .sqs import SqsAuditLog, SqsQueues
from .stepfunctions import StepFunctions
from .stored import StoredBytesRepo
from .tenants import TenantRepo


class NoPolicy:
    """The ``TenantStore`` of a deployment with governance off (``Settings.governance``): every
    tenant has no policy record (the defaults), creations are never counted, and nothing is
    read or written."""

    def get(self, tenant: str) -> TenantPolicy | None:
        return None

    def put(self, policy: TenantPolicy) -> None:
        raise RuntimeError("governance is off in this deployment: tenant policies are not stored")

    def list(self) -> list[TenantPolicy]:
        return []

    def count_creation(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        return True

    def count_request(self, tenant: str, window_start: int, *, limit: int, expires_at: int) -> bool:
        return True


def stores_from_settings(settings: Settings, *, concurrent: bool = False) -> Stores:
    """Every port on AWS, for the deployment ``settings`` describe. ``concurrent``: a set that may
    be called from several threads at once (the GPU worker's store threads): its DynamoDB table
    is a boto3 resource per calling thread (resources are not thread-safe; the clients are).
    Otherwise the process's one resource (a Lambda calls from one thread, and a session per
    thread would cost the local front a session per request)."""
    if concurrent:
        table = Table(per_thread=functools.partial(clients.thread_dynamodb_table, settings.table_name))
    else:
        table = Table(clients.dynamodb_table(settings.table_name))
    # Off: no audit chain, no receipts. On: intents go to the audit queue; no role but the audit
    # appender writes the chains (functions/audit_append builds its own stores).
    audit_log = SqsAuditLog(clients.client("sqs"), settings.audit_queue_url) if settings.governance else None
    track = settings.governance  # the stored-bytes ledger (releases happen whatever the switch says)
    return Stores(
        objects=ObjectStore(clients.client("s3"), settings.bucket_name),
        files=FileRepo(table, track_storage=track),
        uploads=UploadRepo(table, track_storage=track),
        keys=KeyRepo(table),
        batches=BatchRepo(table, track_storage=track),
        queues=SqsQueues(clients.client("sqs")),
        workflows=StepFunctions(clients.client("stepfunctions"), settings.state_machine_arn),
        events=EventBridge(clients.client("events"), settings.event_bus_name),
        tenants=TenantRepo(table) if settings.governance else NoPolicy(),
        stored=StoredBytesRepo(table),
        # The API's actions and the chunk receipts (worker, chunk DLQ consumer: granted
        # sqs:SendMessage on the queue only).
        audit_log=audit_log,
        concurrent=concurrent,
        prepare=table.prepare if concurrent else None,
    )
