"""S3 and DynamoDB adapters. The only code (besides the worker's sink) that touches boto3.

``ClientError`` codes are translated into domain errors here (conditional-check -> ConditionFailed,
throttling -> Throttled); nothing above this module matches on AWS error text.
"""

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from boto3.dynamodb.conditions import Attr, ConditionExpressionBuilder, Key
from botocore.exceptions import ClientError

from . import clients, limits, schema
from .errors import ConditionFailed, Throttled
from .records import ApiKeyRecord, FileRecord, Record, UploadPartRecord, UploadRecord
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

    def set_if(self, pk: str, sk: str, values: dict[str, Any], *, expect: dict[str, Any]) -> dict[str, Any]:
        """Set attributes only if the item exists and every ``expect`` attribute has that value.
        Returns the new item; raises ConditionFailed otherwise."""
        names = {f"#s{i}": k for i, k in enumerate(values)}
        vals = {f":s{i}": v for i, v in enumerate(values.values())}
        condition = Attr(schema.PK).exists()
        for k, v in expect.items():
            condition &= Attr(k).eq(v)
        with _translate():
            resp = self._table.update_item(
                Key={schema.PK: pk, schema.SK: sk},
                UpdateExpression="SET " + ", ".join(f"{n} = :s{i}" for i, n in enumerate(names)),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=vals,
                ConditionExpression=condition,
                ReturnValues="ALL_NEW",
            )
        return resp["Attributes"]

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


@dataclass(frozen=True)
class Update:
    """A transactional update: SET ``values``, ADD ``add``, only if the item exists and every
    ``expect`` attribute has that value."""

    pk: str
    sk: str
    values: dict[str, Any] = field(default_factory=dict)
    add: dict[str, int] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)

    def render(self, table: str) -> dict[str, Any]:
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        clauses = []
        if self.values:
            clauses.append("SET " + ", ".join(f"#u{i} = :u{i}" for i in range(len(self.values))))
        for i, (k, v) in enumerate(self.values.items()):
            names[f"#u{i}"], values[f":u{i}"] = k, v
        if self.add:
            clauses.append("ADD " + ", ".join(f"#a{i} :a{i}" for i in range(len(self.add))))
        for i, (k, v) in enumerate(self.add.items()):
            names[f"#a{i}"], values[f":a{i}"] = k, v
        condition = Attr(schema.PK).exists()
        for k, v in self.expect.items():
            condition &= Attr(k).eq(v)
        expression = _render(condition, names, values)
        return {
            "Update": {
                "TableName": table,
                "Key": {schema.PK: self.pk, schema.SK: self.sk},
                "UpdateExpression": " ".join(clauses),
                "ConditionExpression": expression,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
        }


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
        """Write the concatenation of ``sources`` (key, size) to ``dest`` with S3 multipart.

        S3 requires every part but the last to be at least 5 MiB. A source that is large enough
        is copied server-side (UploadPartCopy); smaller ones are read and coalesced until the
        buffer reaches the minimum, so memory stays bounded by the minimum plus one source."""
        if len(sources) == 1:
            with _translate():
                self._s3.copy_object(Bucket=self.bucket, Key=dest, CopySource={"Bucket": self.bucket, "Key": sources[0][0]})
            return
        with _translate():
            upload_id = self._s3.create_multipart_upload(Bucket=self.bucket, Key=dest)["UploadId"]
        parts: list[dict[str, Any]] = []
        buffer = bytearray()

        def flush() -> None:
            with _translate():
                resp = self._s3.upload_part(
                    Bucket=self.bucket, Key=dest, UploadId=upload_id, PartNumber=len(parts) + 1, Body=bytes(buffer)
                )
            parts.append({"PartNumber": len(parts) + 1, "ETag": resp["ETag"]})
            buffer.clear()

        try:
            for key, size in sources:
                if not buffer and size >= limits.S3_MIN_PART_BYTES:
                    with _translate():
                        resp = self._s3.upload_part_copy(
                            Bucket=self.bucket, Key=dest, UploadId=upload_id, PartNumber=len(parts) + 1,
                            CopySource={"Bucket": self.bucket, "Key": key},
                        )
                    parts.append({"PartNumber": len(parts) + 1, "ETag": resp["CopyPartResult"]["ETag"]})
                    continue
                buffer += self.get(key)
                if len(buffer) >= limits.S3_MIN_PART_BYTES:
                    flush()
            if buffer or not parts:
                flush()
            with _translate():
                self._s3.complete_multipart_upload(
                    Bucket=self.bucket, Key=dest, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
        except BaseException:
            self._s3.abort_multipart_upload(Bucket=self.bucket, Key=dest, UploadId=upload_id)
            raise


@dataclass(frozen=True)
class Stores:
    objects: ObjectStore
    files: FileRepo
    uploads: UploadRepo
    keys: KeyRepo

    @classmethod
    def from_settings(cls, settings: Settings) -> "Stores":
        table = Table(clients.dynamodb_table(settings.table_name))
        return cls(
            objects=ObjectStore(clients.client("s3"), settings.bucket_name),
            files=FileRepo(table),
            uploads=UploadRepo(table),
            keys=KeyRepo(table),
        )


__all__ = ["Stores", "ObjectStore", "Table", "Put", "Update", "FileRepo", "UploadRepo", "KeyRepo", "Record"]
