"""S3 and DynamoDB adapters. The only code (besides the worker's sink) that touches boto3.

``ClientError`` codes are translated into domain errors here (conditional-check -> ConditionFailed,
throttling -> Throttled); nothing above this module matches on AWS error text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionExpressionBuilder, Key
from botocore.exceptions import ClientError

from . import clients, limits, schema
from .errors import ConditionFailed, Throttled
from .records import (
    ApiKeyRecord,
    BatchRecord,
    ChunkRecord,
    FileRecord,
    Record,
    UploadPartRecord,
    UploadRecord,
    chunks_pk,
)
from .settings import Settings

_THROTTLING = {
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "SlowDown",
    "TransactionConflictException",
}


@contextmanager
def _translate() -> Iterator[None]:
    try:
        yield
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ConditionalCheckFailedException":
            raise ConditionFailed(code) from exc
        if code in _THROTTLING:
            raise Throttled("The service is busy; retry the request shortly.") from exc
        raise


# --- DynamoDB ---------------------------------------------------------------------------------
class Table:
    """A thin adapter over a boto3 ``Table`` resource speaking in items."""

    def __init__(self, table: Any):
        self._table = table

    def put(self, item: dict[str, Any], *, if_absent: bool = False) -> None:
        kwargs: dict[str, Any] = {"Item": item}
        if if_absent:
            kwargs["ConditionExpression"] = Attr(schema.PK).not_exists()
        with _translate():
            self._table.put_item(**kwargs)

    def get(self, pk: str, sk: str) -> dict[str, Any] | None:
        with _translate():
            return self._table.get_item(Key={schema.PK: pk, schema.SK: sk}, ConsistentRead=True).get("Item")

    def delete(self, pk: str, sk: str) -> dict[str, Any] | None:
        """Delete and return the old item (None if there was none)."""
        with _translate():
            resp = self._table.delete_item(Key={schema.PK: pk, schema.SK: sk}, ReturnValues="ALL_OLD")
        return resp.get("Attributes")

    def update(self, op: "Update") -> dict[str, Any]:
        """Apply one conditional update; returns the new item (ConditionFailed if it does not hold)."""
        request = op.render(self._table.name)["Update"]
        del request["TableName"]
        with _translate():
            return self._table.update_item(**request, ReturnValues="ALL_NEW")["Attributes"]

    def set_if(self, pk: str, sk: str, values: dict[str, Any], *, expect: dict[str, Any]) -> dict[str, Any]:
        """Set attributes only if the item exists and matches ``expect``; returns the new item."""
        return self.update(Update(pk, sk, values=values, expect=expect))

    def query_page(
        self,
        *,
        pk: str,
        prefix: str,
        after: str | None,
        ascending: bool,
        limit: int,
        keep: Callable[[dict[str, Any]], bool] = lambda _: True,
        index: str | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Up to ``limit`` items of partition ``pk`` whose sort key starts with ``prefix``, in sort
        key order, strictly after the sort key ``prefix + after``. Returns (items, has_more).
        Items for which ``keep`` is false (e.g. expired, awaiting TTL) are skipped."""
        pk_name, sk_name = (schema.GSI_PURPOSE_PK, schema.GSI_PURPOSE_SK) if index else (schema.PK, schema.SK)
        condition = Key(pk_name).eq(pk)
        if after is None:
            if prefix:
                condition &= Key(sk_name).begins_with(prefix)
        elif ascending:
            condition &= Key(sk_name).gt(prefix + after)
        else:
            condition &= Key(sk_name).lt(prefix + after)
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": condition,
            "ScanIndexForward": ascending,
            "Limit": min(limit + 1, 1000),
        }
        if index:
            kwargs["IndexName"] = index
        else:
            kwargs["ConsistentRead"] = True
        out: list[dict[str, Any]] = []
        while True:
            with _translate():
                resp = self._table.query(**kwargs)
            for item in resp["Items"]:
                if not item[sk_name].startswith(prefix):
                    return out, False
                if keep(item):
                    if len(out) == limit:
                        return out, True
                    out.append(item)
            if "LastEvaluatedKey" not in resp:
                return out, False
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def batch_get(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """Items for the given (pk, sk) keys, in no particular order (missing ones left out)."""
        out: list[dict[str, Any]] = []
        for start in range(0, len(keys), 100):
            request = {
                self._table.name: {
                    "Keys": [{schema.PK: pk, schema.SK: sk} for pk, sk in keys[start : start + 100]],
                    "ConsistentRead": True,
                }
            }
            while request:
                with _translate():
                    resp = self._table.meta.client.batch_get_item(RequestItems=request)
                out.extend(resp["Responses"].get(self._table.name, []))
                request = resp.get("UnprocessedKeys") or {}
        return out

    def transact(self, ops: list["Put | Update"]) -> None:
        """Apply all ``ops`` atomically; ConditionFailed if any condition does not hold.
        (The resource's client serializes native values, as for every other call here.)"""
        client = self._table.meta.client
        with _translate():
            try:
                client.transact_write_items(TransactItems=[op.render(self._table.name) for op in ops])
            except client.exceptions.TransactionCanceledException as exc:
                reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
                if "ConditionalCheckFailed" in reasons:
                    raise ConditionFailed(",".join(str(r) for r in reasons)) from exc
                raise


def _render(condition: Any, names: dict[str, str], values: dict[str, Any]) -> str:
    built = ConditionExpressionBuilder().build_expression(condition)
    names.update(built.attribute_name_placeholders)
    values.update(built.attribute_value_placeholders)
    return built.condition_expression


@dataclass(frozen=True)
class Put:
    """A transactional put; ``if_absent`` makes it fail when the item exists."""

    item: dict[str, Any]
    if_absent: bool = False

    def render(self, table: str) -> dict[str, Any]:
        body: dict[str, Any] = {"TableName": table, "Item": self.item}
        if self.if_absent:
            names: dict[str, str] = {}
            values: dict[str, Any] = {}
            body["ConditionExpression"] = _render(Attr(schema.PK).not_exists(), names, values)
            body["ExpressionAttributeNames"] = names
        return {"Put": body}


def _expect(expect: dict[str, Any]) -> Any:
    """The item exists and each attribute equals its value (a tuple: is one of its values;
    None: is absent)."""
    condition = Attr(schema.PK).exists()
    for k, v in expect.items():
        if v is None:
            condition &= Attr(k).not_exists()
        elif isinstance(v, tuple):
            condition &= Attr(k).is_in(list(v))
        else:
            condition &= Attr(k).eq(v)
    return condition


@dataclass(frozen=True)
class Update:
    """A conditional update: SET ``values``, SET ``defaults`` only where absent, ADD ``add``
    (numbers or sets), REMOVE ``remove``; only if the item exists and matches ``expect``."""

    pk: str
    sk: str
    values: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    add: dict[str, Any] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    expect: dict[str, Any] = field(default_factory=dict)

    def render(self, table: str) -> dict[str, Any]:
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        sets, adds, removes = [], [], []
        for i, (k, v) in enumerate(self.values.items()):
            names[f"#u{i}"], values[f":u{i}"] = k, v
            sets.append(f"#u{i} = :u{i}")
        for i, (k, v) in enumerate(self.defaults.items()):
            names[f"#d{i}"], values[f":d{i}"] = k, v
            sets.append(f"#d{i} = if_not_exists(#d{i}, :d{i})")
        for i, (k, v) in enumerate(self.add.items()):
            names[f"#a{i}"], values[f":a{i}"] = k, v
            adds.append(f"#a{i} :a{i}")
        for i, k in enumerate(self.remove):
            names[f"#r{i}"] = k
            removes.append(f"#r{i}")
        clauses = [
            f"{verb} {', '.join(parts)}" for verb, parts in (("SET", sets), ("ADD", adds), ("REMOVE", removes)) if parts
        ]
        expression = _render(_expect(self.expect), names, values)
        request: dict[str, Any] = {
            "TableName": table,
            "Key": {schema.PK: self.pk, schema.SK: self.sk},
            "UpdateExpression": " ".join(clauses),
            "ConditionExpression": expression,
            "ExpressionAttributeNames": names,
        }
        if values:
            request["ExpressionAttributeValues"] = values
        return {"Update": request}


class FileRepo:
    def __init__(self, table: Table):
        self._table = table

    def create(self, record: FileRecord) -> None:
        self._table.put(record.to_item(), if_absent=True)

    def get(self, tenant: str, file_id: str, now: int) -> FileRecord | None:
        item = self._table.get(schema.tenant_pk(tenant), FileRecord.sort_key(file_id))
        if item is None:
            return None
        record = FileRecord.from_item(item)
        return None if record.expired(now) else record

    def delete(self, tenant: str, file_id: str) -> FileRecord | None:
        old = self._table.delete(schema.tenant_pk(tenant), FileRecord.sort_key(file_id))
        return FileRecord.from_item(old) if old else None

    def list(
        self, tenant: str, *, purpose: str | None, after: str | None, ascending: bool, limit: int, now: int
    ) -> tuple[list[FileRecord], bool]:
        def alive(item: dict[str, Any]) -> bool:
            return not (schema.TTL in item and int(item[schema.TTL]) <= now)

        if purpose is None:
            items, more = self._table.query_page(
                pk=schema.tenant_pk(tenant), prefix=FileRecord.sort_key(""), after=after,
                ascending=ascending, limit=limit, keep=alive,
            )
        else:
            items, more = self._table.query_page(
                pk=FileRecord.purpose_pk(tenant, purpose), prefix="", after=after,
                ascending=ascending, limit=limit, keep=alive, index=schema.GSI_PURPOSE,
            )
        return [FileRecord.from_item(i) for i in items], more


class UploadRepo:
    def __init__(self, table: Table):
        self._table = table

    def create(self, record: UploadRecord) -> None:
        self._table.put(record.to_item(), if_absent=True)

    def get(self, tenant: str, upload_id: str) -> UploadRecord | None:
        item = self._table.get(schema.tenant_pk(tenant), UploadRecord.sort_key(upload_id))
        return UploadRecord.from_item(item) if item else None

    def transition(self, record: UploadRecord, status: str, **values: Any) -> UploadRecord:
        """Move a pending upload to ``status``; ConditionFailed if it is no longer pending."""
        item = self._table.set_if(
            schema.tenant_pk(record.tenant), UploadRecord.sort_key(record.id),
            {"status": status, **values}, expect={"status": "pending"},
        )
        return UploadRecord.from_item(item)

    def complete(self, record: UploadRecord, file: FileRecord) -> None:
        """Atomically create the File and mark the pending upload completed with its id."""
        self._table.transact([
            Put(file.to_item(), if_absent=True),
            Update(
                schema.tenant_pk(record.tenant), UploadRecord.sort_key(record.id),
                values={"status": "completed", "file_id": file.id}, expect={"status": "pending"},
            ),
        ])

    def add_part(self, part: UploadPartRecord) -> None:
        self._table.put(part.to_item(), if_absent=True)

    def parts(self, tenant: str, upload_id: str, part_ids: list[str]) -> dict[str, UploadPartRecord]:
        items = self._table.batch_get(
            [(schema.tenant_pk(tenant), UploadPartRecord.sort_key(upload_id, p)) for p in part_ids]
        )
        return {(r := UploadPartRecord.from_item(i)).id: r for i in items}


class KeyRepo:
    def __init__(self, table: Table):
        self._table = table

    def create(self, record: ApiKeyRecord) -> None:
        self._table.put(record.to_item(), if_absent=True)

    def get(self, key_hash: str) -> ApiKeyRecord | None:
        item = self._table.get(schema.key_pk(key_hash), "KEY")
        return ApiKeyRecord.from_item(item) if item else None

    def delete(self, key_hash: str) -> ApiKeyRecord | None:
        old = self._table.delete(schema.key_pk(key_hash), "KEY")
        return ApiKeyRecord.from_item(old) if old else None


@dataclass(frozen=True)
class ChunkOutcome:
    """What recording a chunk did: ``counted`` is False for a duplicate or a late chunk;
    ``last`` is True when, after this call, every chunk of the batch is counted."""

    counted: bool
    last: bool
    batch: BatchRecord


class BatchRepo:
    def __init__(self, table: Table):
        self._table = table

    def create(self, record: BatchRecord) -> None:
        self._table.put(record.to_item(), if_absent=True)

    def get(self, tenant: str, batch_id: str) -> BatchRecord | None:
        item = self._table.get(schema.tenant_pk(tenant), BatchRecord.sort_key(batch_id))
        return BatchRecord.from_item(item) if item else None

    def list(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[BatchRecord], bool]:
        items, more = self._table.query_page(
            pk=schema.tenant_pk(tenant), prefix=BatchRecord.sort_key(""), after=after, ascending=False, limit=limit
        )
        return [BatchRecord.from_item(i) for i in items], more

    def update(
        self,
        batch: BatchRecord,
        *,
        values: dict[str, Any] | None = None,
        defaults: dict[str, Any] | None = None,
        add: dict[str, Any] | None = None,
        remove: tuple[str, ...] = (),
        expect: dict[str, Any] | None = None,
    ) -> BatchRecord:
        """Conditionally update a batch; returns it as now stored (ConditionFailed otherwise)."""
        item = self._table.update(
            Update(
                schema.tenant_pk(batch.tenant), BatchRecord.sort_key(batch.id),
                values=values or {}, defaults=defaults or {}, add=add or {}, remove=remove, expect=expect or {},
            )
        )
        return BatchRecord.from_item(item)

    def record_chunk(self, marker: ChunkRecord) -> ChunkOutcome:
        """Count a finished chunk exactly once: its marker and the batch counters in one
        transaction, only while the batch accepts chunks."""
        counters = {
            "completed": marker.completed,
            "failed": marker.failed,
            "input_tokens": marker.input_tokens,
            "cached_tokens": marker.cached_tokens,
            "output_tokens": marker.output_tokens,
            "reasoning_tokens": marker.reasoning_tokens,
            "chunks_done": 1,
        }
        counted = True
        try:
            self._table.transact([
                Put(marker.to_item(), if_absent=True),
                Update(
                    schema.tenant_pk(marker.tenant), BatchRecord.sort_key(marker.batch_id),
                    add=counters, expect={"accepting": True},
                ),
            ])
        except ConditionFailed:
            counted = False
        current = self.get(marker.tenant, marker.batch_id)
        assert current is not None
        # A duplicate of the last chunk reports last too: its first delivery may have died before
        # signalling, and signalling twice is harmless.
        last = current.chunk_count > 0 and current.chunks_done >= current.chunk_count
        return ChunkOutcome(counted=counted, last=last, batch=current)

    def counted_chunk(self, tenant: str, batch_id: str, chunk: int) -> ChunkRecord | None:
        """The count marker of one chunk (None while it is not counted): one GetItem."""
        item = self._table.get(chunks_pk(tenant, batch_id), ChunkRecord.sort_key(chunk))
        return ChunkRecord.from_item(item) if item else None

    def counted_chunks(self, tenant: str, batch_id: str) -> dict[int, ChunkRecord]:
        items, _ = self._table.query_page(
            pk=chunks_pk(tenant, batch_id), prefix=ChunkRecord.PREFIX, after=None, ascending=True,
            limit=10**9,
        )
        return {(r := ChunkRecord.from_item(i)).chunk: r for i in items}

    def finish(self, batch: BatchRecord, files: list[FileRecord], values: dict[str, Any], expect: dict[str, Any]) -> None:
        """Create the batch's output files and set its terminal state in one transaction."""
        self._table.transact([
            *(Put(f.to_item()) for f in files),
            Update(schema.tenant_pk(batch.tenant), BatchRecord.sort_key(batch.id), values=values, expect=expect),
        ])


# --- S3 ---------------------------------------------------------------------------------------
class ObjectStore:
    def __init__(self, s3: Any, bucket: str):
        self._s3 = s3
        self.bucket = bucket

    def put(self, key: str, body: bytes, content_type: str = "application/octet-stream") -> None:
        with _translate():
            self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)

    def get(self, key: str) -> bytes:
        with _translate():
            return self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def iter_bytes(self, key: str, chunk_size: int = 1024 * 1024) -> Iterator[bytes]:
        with _translate():
            body = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        yield from body.iter_chunks(chunk_size)

    def copy(self, source: str, dest: str) -> None:
        with _translate():
            self._s3.copy_object(Bucket=self.bucket, Key=dest, CopySource={"Bucket": self.bucket, "Key": source})

    def iter_range(self, key: str, start: int, end: int, chunk_size: int = 1024 * 1024) -> Iterator[bytes]:
        """Bytes [start, end) of an object, streamed (one ranged GET)."""
        if end <= start:
            return
        with _translate():
            body = self._s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
        yield from body.iter_chunks(chunk_size)

    def writer(self, key: str) -> "MultipartWriter":
        return MultipartWriter(self._s3, self.bucket, key)

    def size(self, key: str) -> int:
        with _translate():
            return int(self._s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])

    def delete(self, key: str) -> None:
        with _translate():
            self._s3.delete_object(Bucket=self.bucket, Key=key)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for start in range(0, len(keys), 1000):
            with _translate():
                self._s3.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True},
                )

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        with _translate():
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def presigned_get(self, key: str, *, seconds: int, filename: str) -> str:
        return self._s3.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ResponseContentDisposition": f'attachment; filename="{filename}"',
            },
            ExpiresIn=seconds,
        )

    def concatenate(self, dest: str, sources: list[tuple[str, int]]) -> None:
        """Write the concatenation of ``sources`` (key, size) to ``dest`` (one source: a plain
        server-side copy; more: a multipart upload, see ``MultipartWriter.append_object``)."""
        if len(sources) == 1:
            self.copy(sources[0][0], dest)
            return
        with self.writer(dest) as writer:
            for key, size in sources:
                writer.append_object(key, size)


class MultipartWriter:
    """Streams bytes into one S3 object with multipart upload; memory is one part. Use as a
    context manager: the upload completes on success and is aborted on error. Writes nothing
    (no object) when no byte was written."""

    PART_BYTES = 8 * 1024 * 1024

    def __init__(self, s3: Any, bucket: str, key: str):
        self._s3, self._bucket, self.key = s3, bucket, key
        self._buffer = bytearray()
        self._parts: list[dict[str, Any]] = []
        self._upload_id: str | None = None
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self._buffer += data
        self.bytes += len(data)
        if len(self._buffer) >= self.PART_BYTES:
            self._flush()

    def append_object(self, key: str, size: int) -> None:
        """Append another object of the bucket. S3 wants every part but the last to be at least
        5 MiB: an object that large, arriving on a part boundary, is copied server-side
        (UploadPartCopy); a smaller one is read and coalesced with its neighbours."""
        if self._buffer or size < limits.S3_MIN_PART_BYTES:
            with _translate():
                self.write(self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read())
            return
        with _translate():
            resp = self._s3.upload_part_copy(
                Bucket=self._bucket, Key=self.key, UploadId=self._started(), PartNumber=len(self._parts) + 1,
                CopySource={"Bucket": self._bucket, "Key": key},
            )
        self._parts.append({"PartNumber": len(self._parts) + 1, "ETag": resp["CopyPartResult"]["ETag"]})
        self.bytes += size

    def _started(self) -> str:
        if self._upload_id is None:
            with _translate():
                self._upload_id = self._s3.create_multipart_upload(Bucket=self._bucket, Key=self.key)["UploadId"]
        return self._upload_id

    def _flush(self) -> None:
        with _translate():
            number = len(self._parts) + 1
            resp = self._s3.upload_part(
                Bucket=self._bucket, Key=self.key, UploadId=self._started(), PartNumber=number, Body=bytes(self._buffer)
            )
        self._parts.append({"PartNumber": number, "ETag": resp["ETag"]})
        self._buffer.clear()

    def __enter__(self) -> "MultipartWriter":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            if self._upload_id is not None:
                self._s3.abort_multipart_upload(Bucket=self._bucket, Key=self.key, UploadId=self._upload_id)
            return
        if self._upload_id is None:
            if self._buffer:
                with _translate():
                    self._s3.put_object(Bucket=self._bucket, Key=self.key, Body=bytes(self._buffer))
            return
        if self._buffer:
            self._flush()
        with _translate():
            self._s3.complete_multipart_upload(
                Bucket=self._bucket, Key=self.key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
            )


# --- SQS, Step Functions, EventBridge -----------------------------------------------------------
class WorkQueues:
    """Sends work messages to a model's SQS queue (batched, failed entries retried)."""

    def __init__(self, sqs: Any):
        self._sqs = sqs

    def send(self, queue_url: str, bodies: list[str]) -> None:
        for start in range(0, len(bodies), 10):
            entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies[start : start + 10])]
            for _ in range(5):
                with _translate():
                    resp = self._sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
                failed = {f["Id"] for f in resp.get("Failed", [])}
                entries = [e for e in entries if e["Id"] in failed]
                if not entries:
                    break
            else:
                raise Throttled(f"SQS refused {len(entries)} messages after retries")


class Workflows:
    """Starts batch workflows and signals their waiting task."""

    def __init__(self, sfn: Any, state_machine_arn: str):
        self._sfn = sfn
        self._arn = state_machine_arn

    def start(self, name: str, payload: dict[str, Any]) -> None:
        """Start the execution ``name``; starting it again is a no-op."""
        try:
            self._sfn.start_execution(stateMachineArn=self._arn, name=name, input=json.dumps(payload))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ExecutionAlreadyExists":
                raise

    def signal(self, token: str, outcome: dict[str, Any]) -> bool:
        """Resume the waiting task; False if the token is no longer valid (already resumed)."""
        try:
            self._sfn.send_task_success(taskToken=token, output=json.dumps(outcome))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("TaskTimedOut", "InvalidToken", "TaskDoesNotExist"):
                return False
            raise
        return True


class Events:
    """Publishes batch lifecycle events to EventBridge."""

    SOURCE = "batch-api"

    def __init__(self, events: Any, bus: str):
        self._events = events
        self._bus = bus

    def publish(self, detail_type: str, detail: dict[str, Any]) -> None:
        with _translate():
            resp = self._events.put_events(
                Entries=[{"Source": self.SOURCE, "DetailType": detail_type, "Detail": json.dumps(detail), "EventBusName": self._bus}]
            )
        if resp.get("FailedEntryCount"):
            raise Throttled(f"EventBridge refused the event: {resp['Entries']}")


@dataclass(frozen=True)
class Stores:
    objects: ObjectStore
    files: FileRepo
    uploads: UploadRepo
    keys: KeyRepo
    batches: BatchRepo
    queues: WorkQueues
    workflows: Workflows
    events: Events

    @classmethod
    def from_settings(cls, settings: Settings) -> "Stores":
        table = Table(clients.dynamodb_table(settings.table_name))
        return cls(
            objects=ObjectStore(clients.client("s3"), settings.bucket_name),
            files=FileRepo(table),
            uploads=UploadRepo(table),
            keys=KeyRepo(table),
            batches=BatchRepo(table),
            queues=WorkQueues(clients.client("sqs")),
            workflows=Workflows(clients.client("stepfunctions"), settings.state_machine_arn),
            events=Events(clients.client("events"), settings.event_bus_name),
        )


__all__ = ["Stores", "ObjectStore", "Table", "Put", "Update", "FileRepo", "UploadRepo", "KeyRepo", "Record"]
