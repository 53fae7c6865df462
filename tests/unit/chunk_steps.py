"""One chunk of a batch through the worker's path on the fakes, for the workflow and sweeper tests:
open an attempt at it, answer every line 200, write its parts, count it (the real accounting and results)."""

from functions.core import chunk_lifecycle, results, schema
from functions.core.chunk_lifecycle import ChunkOutcome
from functions.core.messages import ChunkManifest
from tests.chunks import open_attempt


def run_chunk(stores, chunk: int, *, now: int, tenant: str = "acme", batch_id: str = "batch_1") -> ChunkOutcome:
    batch = stores.batches.get(tenant, batch_id)
    manifest = ChunkManifest.model_validate_json(stores.objects.get(schema.batch_manifest_key(tenant, batch_id)))
    message = batch.work_message(manifest.chunks[chunk])
    open_attempt(stores, message)
    lines = [
        results.response_line(l.custom_id, 200, {"object": "chat.completion"}, "r")
        for l in results.unrun_lines(stores.objects, message, "x", "x")
    ]
    parts = results.write_parts(stores.objects, message, lines)
    return chunk_lifecycle.record_chunk(stores, message, parts=parts, usage=chunk_lifecycle.Usage(), now=now)
