"""S3: the object store port (``Objects``) and its streaming multipart writer."""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import Any

from botocore.exceptions import ClientError

from .. import http, limits
from ..anchor import WormObject
from .errors import translate


class ObjectStore:
    def __init__(self, s3: Any, bucket: str):
        self._s3 = s3
        self.bucket = bucket

    def put(self, key: str, body: bytes, content_type: str = "application/octet-stream") -> None:
        with translate():
            self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)

    def get(self, key: str) -> bytes:
        with translate():
            return self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def iter_bytes(self, key: str, chunk_size: int = 1024 * 1024) -> Iterator[bytes]:
        with translate():
            body = self._s3.get_object(Bucket=self.bucket, Key=key)["Body"]
        yield from body.iter_chunks(chunk_size)

    def iter_objects(
        self, keys: Sequence[str], *, ahead: int = limits.S3_READ_AHEAD, chunk_size: int = 1024 * 1024
    ) -> Generator[Iterator[bytes]]:
        """Each of ``keys`` in turn, streamed, with the GETs of up to ``ahead`` next keys already
        sent: one object after another costs a round trip each (S3's time to first byte, tens of
        milliseconds), and a batch has up to hundreds of parts. The bodies opened ahead are not
        read until their turn (memory: what their sockets hold); closing the iterator closes them."""
        opened: deque[Future[Any]] = deque()
        remaining = iter(keys)
        with ThreadPoolExecutor(max_workers=ahead + 1, thread_name_prefix="s3-read-ahead") as pool:

            def send(upto: int) -> None:
                for key in islice(remaining, max(0, upto - len(opened))):
                    opened.append(pool.submit(self._s3.get_object, Bucket=self.bucket, Key=key))

            try:
                send(ahead + 1)
                while opened:
                    with translate():
                        body = opened.popleft().result()["Body"]
                    send(ahead)
                    try:
                        yield body.iter_chunks(chunk_size)
                    finally:
                        body.close()
            finally:
                for future in opened:  # opened ahead and not reached (an error, a close)
                    if not future.cancel() and future.exception() is None:
                        future.result()["Body"].close()

    def copy(self, source: str, dest: str) -> None:
        with translate():
            self._s3.copy_object(Bucket=self.bucket, Key=dest, CopySource={"Bucket": self.bucket, "Key": source})

    def iter_range(self, key: str, start: int, end: int, chunk_size: int = 1024 * 1024) -> Iterator[bytes]:
        """Bytes [start, end) of an object, streamed (one ranged GET)."""
        if end <= start:
            return
        with translate():
            body = self._s3.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
        yield from body.iter_chunks(chunk_size)

    def writer(self, key: str) -> MultipartWriter:
        return MultipartWriter(self._s3, self.bucket, key)

    def size(self, key: str) -> int:
        with translate():
            return int(self._s3.head_object(Bucket=self.bucket, Key=key)["ContentLength"])

    def delete(self, key: str) -> None:
        with translate():
            self._s3.delete_object(Bucket=self.bucket, Key=key)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        for start in range(0, len(keys), 1000):
            with translate():
                self._s3.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]], "Quiet": True},
                )

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        with translate():
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def presigned_get(self, key: str, *, seconds: int, filename: str) -> str:
        return self._s3.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": key,
                "ResponseContentDisposition": http.content_disposition(filename),
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
            with translate():
                self.write(self._s3.get_object(Bucket=self._bucket, Key=key)["Body"].read())
            return
        with translate():
            resp = self._s3.upload_part_copy(
                Bucket=self._bucket,
                Key=self.key,
                UploadId=self._started(),
                PartNumber=len(self._parts) + 1,
                CopySource={"Bucket": self._bucket, "Key": key},
            )
        self._parts.append({"PartNumber": len(self._parts) + 1, "ETag": resp["CopyPartResult"]["ETag"]})
        self.bytes += size

    def _started(self) -> str:
        if self._upload_id is None:
            with translate():
                self._upload_id = self._s3.create_multipart_upload(Bucket=self._bucket, Key=self.key)["UploadId"]
        return self._upload_id

    def _flush(self) -> None:
        with translate():
            number = len(self._parts) + 1
            resp = self._s3.upload_part(
                Bucket=self._bucket, Key=self.key, UploadId=self._started(), PartNumber=number, Body=bytes(self._buffer)
            )
        self._parts.append({"PartNumber": number, "ETag": resp["ETag"]})
        self._buffer.clear()

    def __enter__(self) -> MultipartWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            if self._upload_id is not None:
                self._s3.abort_multipart_upload(Bucket=self._bucket, Key=self.key, UploadId=self._upload_id)
            return
        if self._upload_id is None:
            if self._buffer:
                with translate():
                    self._s3.put_object(Bucket=self._bucket, Key=self.key, Body=bytes(self._buffer))
            return
        if self._buffer:
            self._flush()
        with translate():
            self._s3.complete_multipart_upload(
                Bucket=self._bucket, Key=self.key, UploadId=self._upload_id, MultipartUpload={"Parts": self._parts}
            )


#: The error S3 answers a conditional PUT (``If-None-Match: *``) whose key exists.
PRECONDITION_FAILED = "PreconditionFailed"


class WormObjects:
    """The ``WormStore`` port on an S3 bucket with Object Lock (infra/constructs/audit.py). A key
    is written once: ``If-None-Match: *`` (S3 conditional writes) refuses a second PUT of it, so a
    redelivered intent never adds a version, and the bucket policy refuses any PUT without the
    header. Every PUT carries a SHA-256 checksum, which Object Lock requires of PUTs (a
    Content-MD5 or an x-amz-checksum). ``originals`` reads each key's first version: a later
    version (a PUT without If-None-Match) or a delete marker cannot replace what was written first,
    which the lock keeps."""

    def __init__(self, s3: Any, bucket: str):
        self._s3, self.bucket = s3, bucket

    def put_once(self, key: str, body: bytes) -> bool:
        try:
            with translate():
                self._s3.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    ContentType="application/json",
                    ChecksumAlgorithm="SHA256",
                    IfNoneMatch="*",
                )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == PRECONDITION_FAILED:
                return False
            raise
        return True

    def find(self, key: str) -> bytes | None:
        try:
            with translate():
                return self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _ABSENT:
                return None
            raise

    def any_after(self, prefix: str, key: str) -> bool:
        with translate():
            listed = self._s3.list_objects_v2(Bucket=self.bucket, Prefix=prefix, StartAfter=key, MaxKeys=1)
        return bool(listed.get("Contents"))

    def originals(self, prefix: str) -> dict[str, WormObject]:
        """One ListObjectVersions walk of ``prefix``, then a GET of each key's first version. S3
        lists versions by key, then from most to least recent (the ListVersions reference), so a
        key's last listed version is the one written first."""
        versions: dict[str, list[str]] = {}
        hidden: set[str] = set()
        paginator = self._s3.get_paginator("list_object_versions")
        with translate():
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for version in page.get("Versions", []):
                    versions.setdefault(version["Key"], []).append(version["VersionId"])
                hidden |= {m["Key"] for m in page.get("DeleteMarkers", []) if m.get("IsLatest")}
        out = {}
        for key, ids in versions.items():
            with translate():
                body = self._s3.get_object(Bucket=self.bucket, Key=key, VersionId=ids[-1])["Body"].read()
            out[key] = WormObject(body=body, versions=len(ids), hidden=key in hidden)
        return out


#: Error codes of a GET whose key does not exist (or only as a delete marker).
_ABSENT = frozenset({"NoSuchKey", "404", "NotFound"})
