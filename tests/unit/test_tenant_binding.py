"""Tenant binding on worker-side reads (docs/governance.md, "Tenant binding on worker-side reads"): a work message whose input key is not its
own tenant's batch input (forged or misrouted) makes neither the worker nor the DLQ Lambda read
anything; every other read of a chunk is keyed by the message's tenant and batch."""

from unittest import mock

import pytest
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from functions.chunk_dlq import handler as chunk_dlq_handler
from functions.core import schema
from tests.unit.test_worker_loop import RETRY_AFTER_FAILURE, Rig, seed

OTHER_KEY = schema.batch_input_key("globex", "batch_9")


@pytest.mark.parametrize(
    "key, bound",
    [
        (schema.batch_input_key("acme", "batch_1"), True),
        (OTHER_KEY, False),  # another tenant's input
        (schema.batch_input_key("acme", "batch_2"), False),  # the tenant's other batch
        ("batches/acme/batch_1/../../globex/batch_9/input.jsonl", False),
        ("batches/acme/batch_1/chunks.json", False),
        ("files/acme/file-1", False),
    ],
)
def test_a_message_is_bound_only_to_its_own_tenants_batch_input(key: str, bound: bool) -> None:
    rig = Rig()
    (message,) = seed(rig.stores, 2, per_chunk=2)
    assert message.model_copy(update={"input_key": key}).bound() is bound


def test_the_worker_refuses_a_forged_message_without_reading_anything() -> None:
    rig = Rig(max_open_chunks=1)
    (good,) = seed(rig.stores, 2, per_chunk=2)
    rig.stores.objects.put(OTHER_KEY, b'{"secret": "globex data"}\n')
    forged = good.model_copy(update={"input_key": OTHER_KEY})
    reads: list[str] = []
    real_get = rig.stores.objects.get
    rig.stores.objects.get = lambda key: reads.append(key) or real_get(key)  # type: ignore[method-assign]
    rig.queue.send([forged.model_dump_json(), good.model_dump_json()])
    bad = rig.queue.messages[0]
    rig.run_until(lambda: rig.counted(0) and rig.queue.deleted, "the good chunk counted")
    assert OTHER_KEY not in reads
    assert rig.queue.releases == [(f"{bad.id}#1", RETRY_AFTER_FAILURE)]  # to the DLQ after its receives
    assert rig.log.messages("error") == ["work message not bound to its tenant"]
    assert rig.engine.contents() == ["hi 0", "hi 1"]  # only the good chunk ran
    assert rig.metrics.totals.chunks_failed == 1


def test_the_dlq_lambda_drops_a_forged_message_without_touching_any_store() -> None:
    rig = Rig()
    (good,) = seed(rig.stores, 2, per_chunk=2)
    forged = good.model_copy(update={"input_key": OTHER_KEY})
    record = SQSRecord(
        {"messageId": "m1", "body": forged.model_dump_json(), "attributes": {"ApproximateReceiveCount": "5"}}
    )
    with mock.patch.object(chunk_dlq_handler.deps, "stores", side_effect=AssertionError("a store was used")) as stores:
        chunk_dlq_handler.handle_record(record)
    stores.assert_not_called()
