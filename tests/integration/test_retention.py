"""Deleting a file removes its bytes now, while a batch made from it keeps running on its own
snapshot; everything that batch wrote lies under its prefix, which the bucket's batch-data rule
(tests/infra/test_retention.py) removes on its schedule. On moto, through the real handlers."""

import json

from functions.core import schema
from infra.constructs.storage import BATCHES_PREFIX

from .batch_helpers import run_ingest, take_work

CHAT = "/v1/chat/completions"


def _line(i: int) -> str:
    body = {"model": "test-chat", "messages": [{"role": "user", "content": f"hi {i}"}]}
    return json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": body})


def test_deleting_the_input_file_removes_its_bytes_now_and_the_running_batch_keeps_its_snapshot(
    client, stores, deployed
):
    content = ("\n".join(_line(i) for i in range(3)) + "\n").encode()
    f = client.files.create(file=("in.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    run_ingest()
    assert client.batches.retrieve(batch.id).status == "in_progress"
    file_key = schema.file_key("acme", f.id)
    assert file_key in stores.objects.list_keys("files/acme/")

    client.files.delete(f.id)

    # The file's bytes are gone at once (not at some later sweep)...
    assert file_key not in stores.objects.list_keys("files/acme/")
    # ...and the batch still reads its chunks from its own snapshot, under its own prefix.
    (message,) = take_work(deployed)
    assert message.input_key == schema.batch_input_key("acme", batch.id)
    lines = b"".join(stores.objects.iter_range(message.input_key, message.byte_start, message.byte_end))
    assert lines == content
    prefix = schema.batch_prefix("acme", batch.id)
    written = stores.objects.list_keys(prefix)
    assert {schema.batch_input_key("acme", batch.id), schema.batch_manifest_key("acme", batch.id)} <= set(written)
    # Everything the batch owns is batch data (the lifecycle rule's prefix); the file never was.
    assert all(k.startswith(BATCHES_PREFIX) for k in written)
    assert not file_key.startswith(BATCHES_PREFIX)
