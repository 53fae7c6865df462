"""The agreement invariant of a finished batch (docs/reliability.md, "Nothing completed is lost"):
whatever terminal status a batch reached after lines ran (completed, expired, cancelled, failed),

- ``request_counts.completed`` is the number of lines of its output file, ``failed`` of its
  error file, and ``completed + failed == total``;
- every input request appears exactly once across both files (by custom_id), each file in input
  order, every output line a 2xx response and every error line not;
- a file id is set exactly when its file has lines, and the file's record says its true size.

Two entry points, one check: ``assert_stores_agree`` reads the batch and its files through the
ports (the in-memory fakes or moto), ``assert_api_agrees`` through the official SDK."""

from typing import Any

from functions.core import chunk_lifecycle, results
from functions.core.ports import Stores
from functions.core.wire import TERMINAL_STATUSES, BatchOutputLine


def _lines(body: bytes) -> list[BatchOutputLine]:
    assert body == b"" or body.endswith(b"\n"), "a result file ends with a newline"
    return [BatchOutputLine.model_validate_json(l) for l in body.splitlines()]


def check_agreement(
    *,
    status: str,
    completed: int,
    failed: int,
    total: int,
    output: list[BatchOutputLine],
    errors: list[BatchOutputLine],
    custom_ids: list[str] | None,
) -> None:
    """The invariant on what a batch says and what its files hold (``custom_ids``: the input's
    custom_ids in input order, if the caller knows them)."""
    assert status in TERMINAL_STATUSES, f"not finished: {status}"
    assert completed == len(output), f"request_counts.completed={completed}, output file has {len(output)} lines"
    assert failed == len(errors), f"request_counts.failed={failed}, error file has {len(errors)} lines"
    assert completed + failed == total, f"completed {completed} + failed {failed} != total {total}"
    seen = [l.custom_id for l in output + errors]
    assert len(set(seen)) == len(seen), f"a custom_id appears twice: {sorted(c for c in seen if seen.count(c) > 1)}"
    assert all(results.succeeded(l) for l in output), "an output line is not a 2xx response"
    assert not any(results.succeeded(l) for l in errors), "an error line is a 2xx response"
    assert len({l.id for l in output + errors}) == len(output) + len(errors), "a line id appears twice"
    if custom_ids is not None:
        missing, extra = sorted(set(custom_ids) - set(seen)), sorted(set(seen) - set(custom_ids))
        assert sorted(seen) == sorted(custom_ids), (
            f"the files do not hold exactly the input's requests: missing {missing}, extra {extra}"
        )
        order = {c: i for i, c in enumerate(custom_ids)}
        for part in (output, errors):
            ids = [l.custom_id for l in part]
            assert ids == sorted(ids, key=order.__getitem__), "a file is not in input order"


def assert_stores_agree(
    stores: Stores, tenant: str, batch_id: str, custom_ids: list[str] | None = None, *, now: int = 0
) -> tuple[list[BatchOutputLine], list[BatchOutputLine]]:
    """Read the batch and both its files through the ports and check the invariant; returns the
    output and error lines. ``now`` is when the file records are read (0: before any expiry)."""
    batch = stores.batches.get(tenant, batch_id)
    assert batch is not None, f"no batch {batch_id}"
    files: list[list[BatchOutputLine]] = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is None:
            files.append([])
            continue
        record = stores.files.get(tenant, file_id, now)
        assert record is not None, f"file {file_id} has no record"
        body = stores.objects.get(record.s3_key)
        assert record.bytes == len(body) > 0, (
            f"file {file_id}: record says {record.bytes} bytes, object has {len(body)}"
        )
        assert record.purpose == "batch_output"
        files.append(_lines(body))
    output, errors = files
    check_agreement(
        status=batch.status,
        completed=batch.completed,
        failed=batch.failed,
        total=batch.total,
        output=output,
        errors=errors,
        custom_ids=custom_ids,
    )
    return output, errors


def assert_usage_agrees(stores: Stores, tenant: str, batch_id: str) -> dict[str, int]:
    """The batch's usage is its output file's: the sum of each 2xx line's ``usage``
    (``results.usage_of``), for a batch whose counted chunks reported their lines' usage (the
    worker's and the DLQ consumer's rule) and whose uncounted chunks' checkpointed lines finalize
    kept. Returns the usage."""
    batch = stores.batches.get(tenant, batch_id)
    assert batch is not None, f"no batch {batch_id}"
    body = b""
    if batch.output_file_id is not None:
        record = stores.files.get(tenant, batch.output_file_id, 0)
        assert record is not None
        body = stores.objects.get(record.s3_key)
    usage = chunk_lifecycle.Usage()
    for line in _lines(body):
        usage.add_response(results.usage_of(line))
    said = {k: getattr(batch, k) for k in chunk_lifecycle.Usage.model_fields}
    added = usage.model_dump()
    wrong = {k: (said[k], added[k]) for k in said if said[k] != added[k]}
    assert not wrong, f"usage (the batch's, its output lines' sum) differs: {wrong}"
    return said


def assert_api_agrees(
    client: Any, batch: Any, custom_ids: list[str] | None = None
) -> tuple[list[BatchOutputLine], list[BatchOutputLine]]:
    """The same check as a tenant sees it: ``batch`` as the SDK returned it, files read through
    the Files API with ``client`` (an ``openai.OpenAI``)."""
    files: list[list[BatchOutputLine]] = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id is None:
            files.append([])
            continue
        meta = client.files.retrieve(file_id)
        body = client.files.content(file_id).content
        assert meta.purpose == "batch_output" and meta.bytes == len(body) > 0, (meta, len(body))
        files.append(_lines(body))
    output, errors = files
    counts = batch.request_counts
    check_agreement(
        status=batch.status,
        completed=counts.completed,
        failed=counts.failed,
        total=counts.total,
        output=output,
        errors=errors,
        custom_ids=custom_ids,
    )
    return output, errors
