"""Storage layout, defined once: DynamoDB key schema and S3 key layout.

The CDK storage construct and the local deployment build the table from ``TABLE_SCHEMA``; the
stores build every key with the functions below. Every item a caller can read lives under a
partition key that starts with the caller's tenant, so a cross-tenant read is impossible by
construction.
"""

from typing import Any, Final

PK: Final = "pk"
SK: Final = "sk"
#: GSI listing a tenant's files of one purpose (newest first by id).
GSI_PURPOSE: Final = "by_purpose"
GSI_PURPOSE_PK: Final = "gsi1pk"
GSI_PURPOSE_SK: Final = "gsi1sk"
#: Sparse GSI of the OPEN (non-terminal) batches, for the sweeper (functions/sweeper): a batch
#: item carries these two attributes from its creation until the write that makes it terminal,
#: which removes them (``BatchRepo``), so the index holds only open batches and the sweeper finds
#: them with one Query, never a scan. KEYS_ONLY: chunk counting (the busy writes) never touches the
#: index; the sweeper reads each open batch by key.
GSI_OPEN: Final = "open_batches"
GSI_OPEN_PK: Final = "open_pk"
GSI_OPEN_SK: Final = "open_sk"
#: The one partition of ``GSI_OPEN``: only a batch's creation and its terminal write change the
#: index (two writes per batch), far below a partition's 1,000 writes per second.
OPEN_PARTITION: Final = "OPEN"
#: DynamoDB TTL attribute (unix seconds). Reads also treat an item past it as gone, because
#: DynamoDB deletes expired items lazily.
TTL: Final = "ttl"

TABLE_SCHEMA: Final[dict[str, Any]] = {
    "KeySchema": [{"AttributeName": PK, "KeyType": "HASH"}, {"AttributeName": SK, "KeyType": "RANGE"}],
    "AttributeDefinitions": [
        {"AttributeName": name, "AttributeType": "S"}
        for name in (PK, SK, GSI_PURPOSE_PK, GSI_PURPOSE_SK, GSI_OPEN_PK, GSI_OPEN_SK)
    ],
    "GlobalSecondaryIndexes": [
        {
            "IndexName": GSI_PURPOSE,
            "KeySchema": [
                {"AttributeName": GSI_PURPOSE_PK, "KeyType": "HASH"},
                {"AttributeName": GSI_PURPOSE_SK, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "ALL"},
        },
        {
            "IndexName": GSI_OPEN,
            "KeySchema": [
                {"AttributeName": GSI_OPEN_PK, "KeyType": "HASH"},
                {"AttributeName": GSI_OPEN_SK, "KeyType": "RANGE"},
            ],
            "Projection": {"ProjectionType": "KEYS_ONLY"},
        },
    ],
    "BillingMode": "PAY_PER_REQUEST",
    # The stream carries TTL deletions to the reaper, which removes the objects' bytes (old
    # images), and new audit records to the WORM copy (functions/audit_export: new images).
    "StreamSpecification": {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
}


def tenant_pk(tenant: str) -> str:
    """A tenant's own partition: its files, uploads (and their parts). The GPU worker cannot reach
    it (infra/constructs/worker.py): batches live in ``batches_pk``, webhook records in
    ``functions.webhooks.store.webhooks_pk``."""
    return f"T#{tenant}"


#: Suffix of a tenant's batch partition. Batches have a partition of their own (not the tenant's)
#: so that the GPU worker's IAM ``dynamodb:LeadingKeys`` can name exactly the partitions it uses
#: (this one and a batch's chunk partition) and never a file or upload record.
BATCHES_SUFFIX: Final = "#BATCHES"


def batches_pk(tenant: str) -> str:
    """The partition of a tenant's batch items (``T#<tenant>#BATCHES``)."""
    return f"{tenant_pk(tenant)}{BATCHES_SUFFIX}"


def tenant_of_batches_pk(pk: str) -> str:
    """The tenant of a ``batches_pk`` partition key."""
    prefix = tenant_pk("")
    if not (pk.startswith(prefix) and pk.endswith(BATCHES_SUFFIX)):
        raise ValueError(f"not a batch partition: {pk!r}")
    return pk[len(prefix) : -len(BATCHES_SUFFIX)]


def chunks_pk(tenant: str, batch_id: str, shard: int = 0) -> str:
    """The partition of one counting shard of a batch: its chunks' count markers and run records,
    and the shard's counters (``T#<tenant>#B#<batch>``; ``...#S<n>`` for shard n > 0,
    ``limits.shard_of``)."""
    base = f"{tenant_pk(tenant)}#B#{batch_id}"
    return f"{base}#S{shard}" if shard else base


def key_pk(key_hash: str) -> str:
    """An API key's item (``records.ApiKeyRecord``): the only item the authorizer reads (its IAM
    names ``KEY#*`` in ``dynamodb:LeadingKeys``), so it carries everything the authorizer decides on."""
    return f"KEY#{key_hash}"


def tenant_keys_pk(tenant: str) -> str:
    """The partition listing a tenant's keys: one item per key (sort key ``KEY#<key id>``), written
    and deleted in one transaction with the key's ``key_pk`` item, so ``batchctl keys list`` and
    ``tenants disable`` read one strongly consistent Query, never a scan."""
    return f"{tenant_pk(tenant)}#KEYS"


def key_id_pk(key_id: str) -> str:
    """A key id's lookup item (its tenant and key hash), for ``batchctl keys revoke --id``. Not
    under ``KEY#``: the authorizer cannot read it."""
    return f"KEYID#{key_id}"


def requests_pk(tenant: str) -> str:
    """The partition of a tenant's request-rate counters (``requests_per_minute``): one item per
    minute window (``MINUTE#<start>``), removed by TTL."""
    return f"{tenant_pk(tenant)}#REQUESTS"


def stored_pk(tenant: str) -> str:
    """The partition of a tenant's stored-bytes ledger (``max_stored_bytes``, docs/governance.md):
    the counter item (``STORED_USAGE_SK``, attribute ``bytes``) and one marker per file or upload
    holding a reservation (``stored_marker_sk``), written with the reservation and deleted with its
    release in one transaction, so a release happens once however often it is attempted."""
    return f"{tenant_pk(tenant)}#STORAGE"


STORED_USAGE_SK: Final = "USAGE"


def stored_marker_sk(holder: str) -> str:
    """The marker of one holder: ``FileRecord.sort_key(id)`` or ``UploadRecord.sort_key(id)``."""
    return f"HOLD#{holder}"


#: The one partition of every tenant's policy (``functions.core.tenants``): one item per tenant,
#: sort key = the tenant, so ``batchctl tenants list`` is one Query, never a scan. Read once per
#: batch create and once per ingest: far below a partition's limits. Ingest's IAM names it in
#: ``dynamodb:LeadingKeys`` (GetItem only).
TENANTS_PK: Final = "TENANTS"


def tenant_policy_sk(tenant: str) -> str:
    return f"POLICY#{tenant}"


def enqueued_pk(tenant: str) -> str:
    """The partition of a tenant's enqueued-cap counters: ``T#<tenant>#ENQUEUED``, one item per
    model (``enqueued_sk``) holding ``requests`` and ``tokens`` reserved by batches not yet terminal."""
    return f"{tenant_pk(tenant)}#ENQUEUED"


def enqueued_sk(model: str) -> str:
    return f"MODEL#{model}"


def budget_pk(tenant: str) -> str:
    """The partition of a tenant's output-token budget items: ``T#<tenant>#BUDGET``, one item per
    period (``tenants.budget_sk``: ``MONTH#2026-12`` or ``DAY#2026-12-02``) holding ``output_tokens``."""
    return f"{tenant_pk(tenant)}#BUDGET"


def creations_pk(tenant: str) -> str:
    """The partition of a tenant's batch-creation counters (one item per hour window, removed by
    TTL): ``T#<tenant>#CREATES``, apart from the tenant's files so the reaper's stream filter and
    the worker never see them."""
    return f"{tenant_pk(tenant)}#CREATES"


def audit_pk(tenant: str) -> str:
    """The partition of a tenant's audit chain (docs/audit.md): records at ``AUDIT_SEQ_PREFIX`` +
    zero-padded seq, dedupe markers at ``AUDIT_DEDUPE_PREFIX`` + key."""
    return f"AUDIT#{tenant}"


AUDIT_SEQ_PREFIX: Final = "SEQ#"
AUDIT_DEDUPE_PREFIX: Final = "DEDUPE#"


def audit_seq_sk(seq: int) -> str:
    return f"{AUDIT_SEQ_PREFIX}{seq:012d}"


#: Partition key prefix of the GPU scaler's state items (functions/scaler): one per model.
SCALER_PREFIX: Final = "SCALER#"


def scaler_pk(model: str) -> str:
    return f"{SCALER_PREFIX}{model}"


# --- S3 ---------------------------------------------------------------------------------------
def file_key(tenant: str, file_id: str) -> str:
    return f"files/{tenant}/{file_id}"


#: Upload parts live here until assembled; the bucket's lifecycle removes leftovers.
UPLOADS_PREFIX = "uploads/"


def upload_prefix(tenant: str, upload_id: str) -> str:
    return f"{UPLOADS_PREFIX}{tenant}/{upload_id}/"


def upload_part_key(tenant: str, upload_id: str, part_id: str) -> str:
    return f"{upload_prefix(tenant, upload_id)}{part_id}"


#: Everything a batch owns (its input snapshot, chunk manifest, result parts) lives under here.
BATCHES_PREFIX = "batches/"


def batch_prefix(tenant: str, batch_id: str) -> str:
    return f"{BATCHES_PREFIX}{tenant}/{batch_id}/"


#: The snapshot of a batch's input; its ObjectCreated event starts ingestion.
INPUT_NAME = "input.jsonl"


def batch_input_key(tenant: str, batch_id: str) -> str:
    return f"{batch_prefix(tenant, batch_id)}{INPUT_NAME}"


def parse_batch_input_key(key: str) -> tuple[str, str] | None:
    """(tenant, batch_id) of a snapshot key, or None for any other key."""
    parts = key.split("/")
    if len(parts) == 4 and parts[0] == "batches" and parts[3] == INPUT_NAME:
        return parts[1], parts[2]
    return None


def batch_manifest_key(tenant: str, batch_id: str) -> str:
    return f"{batch_prefix(tenant, batch_id)}chunks.json"


def chunk_part_key(tenant: str, batch_id: str, chunk: int, attempt: str, kind: str) -> str:
    """Where one attempt at a chunk writes its results; ``kind`` is "out" or "err". Each attempt
    writes its own keys and the chunk's count marker names the attempt that was counted, so a
    second worker running the same chunk can never change the counted results."""
    return f"{batch_prefix(tenant, batch_id)}parts/{chunk:06d}.{attempt}.{kind}.jsonl"


def chunk_checkpoint_key(tenant: str, batch_id: str, chunk: int, start: int, end: int) -> str:
    """A checkpoint of a running chunk: the result lines of its request lines [start, end) (0 =
    the chunk's first non-blank line), in input order. Deterministic: any attempt writing the
    same segment writes the same key. Only the chunk's run record names the segments to read."""
    return f"{batch_prefix(tenant, batch_id)}parts/{chunk:06d}.ckpt.{start:06d}-{end:06d}.jsonl"
