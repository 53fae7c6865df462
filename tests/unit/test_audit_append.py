"""The audit appender (functions/audit_append): once per dedupe key however often the queue
delivers an intent, the WORM copy completed by a redelivery after a crash between the append and
the copy, a cut tail never written over, receipts built from the chunk's own count marker, and
the handler's partial batch failures and one checkpoint per tenant per invocation."""

import hashlib
import json

import pytest

from functions.audit_append import handler as append_handler
from functions.audit_append.logic import AppenderStores, Invocation
from functions.core import anchor, audit, schema, signing
from functions.core.records import ChunkRecord
from infra.local.lambda_context import LocalLambdaContext
from tests.builders import assert_fields
from tests.fakes.aws import FakeAudit, FakeWorm, KeySigner, fake_stores, throttle
from tests.unit.test_chunk_lifecycle import message

T0 = 1_796_083_200
TENANT = "acme"


@pytest.fixture
def stores():
    base = fake_stores()
    return base, AppenderStores(
        chain=FakeAudit(base.faults),
        worm=FakeWorm(base.faults),
        signer=KeySigner(),
        batches=base.batches,
        objects=base.objects,
    )


def run(appender: AppenderStores) -> Invocation:
    return Invocation(appender, now=lambda: T0, sleep=lambda _: None)


def intent(i: int = 0, tenant: str = TENANT) -> audit.AuditIntent:
    return audit.api_intent(
        tenant,
        method="POST",
        path="/v1/files",
        status=200,
        body=json.dumps({"id": f"file-{i}"}),
        authorization="Bearer sk-x",
        request_id=f"req-{i}",
        at=T0 + i,
    )


def copies(worm: FakeWorm, tenant: str = TENANT) -> dict[str, list[bytes]]:
    return {k: v for k, v in worm.versions.items() if k.startswith(anchor.worm_prefix(tenant))}


def test_an_intent_is_appended_copied_and_checkpointed(stores):
    _, appender = stores
    invocation = run(appender)
    taken = invocation.take(intent())
    assert taken.outcome == "appended" and taken.record.seq == 1
    assert (taken.record.action, taken.record.target, taken.record.request_id) == ("files.create", "file-0", "req-0")
    assert copies(appender.worm) == {anchor.worm_key(TENANT, 1): [taken.record.to_json().encode()]}
    checkpoint = invocation.checkpoint(TENANT)
    assert (checkpoint.seq, checkpoint.hash, checkpoint.key_id) == (1, taken.record.hash, appender.signer.key_id)
    stored = anchor.SignedCheckpoint.model_validate_json(appender.worm.find(anchor.checkpoint_key(TENANT, 1)))
    assert signing.verifier(appender.signer.public_key())(stored.checkpoint.message(), stored.signature_bytes())


def test_a_redelivered_intent_is_appended_once(stores):
    _, appender = stores
    first = run(appender).take(intent())
    again = run(appender)
    taken = again.take(intent())  # SQS delivered it again
    assert taken.outcome == "duplicate" and taken.record == first.record
    assert len(appender.chain.records(TENANT)) == 1
    assert [len(v) for v in copies(appender.worm).values()] == [1]  # no second version of its copy
    again.checkpoint(TENANT)  # a checkpoint written before: a no-op
    assert len(appender.worm.versions[anchor.checkpoint_key(TENANT, 1)]) == 1


def test_a_crash_between_the_append_and_the_copy_is_completed_by_the_redelivery(stores):
    base, appender = stores
    base.faults.fail("worm.put_once", TimeoutError())  # the append is committed, then the copy fails
    with pytest.raises(TimeoutError):
        run(appender).take(intent())
    assert len(appender.chain.records(TENANT)) == 1 and copies(appender.worm) == {}
    redelivered = run(appender)
    taken = redelivered.take(intent())
    assert taken.outcome == "duplicate" and taken.record.seq == 1
    assert copies(appender.worm) == {anchor.worm_key(TENANT, 1): [taken.record.to_json().encode()]}
    assert redelivered.checkpoint(TENANT).seq == 1
    assert len(appender.chain.records(TENANT)) == 1


def test_a_cut_tail_is_not_written_over(stores):
    _, appender = stores
    invocation = run(appender)
    for i in range(3):
        invocation.take(intent(i))
    for seq in (2, 3):  # a writer of the table deletes the last two records
        del appender.chain.chains[TENANT][seq]
    taken = run(appender).take(intent(9))
    assert taken.outcome == "appended" and taken.skipped == (2, 3) and taken.record.seq == 4
    original_3 = audit.AuditRecord.model_validate_json(appender.worm.find(anchor.worm_key(TENANT, 3)))
    assert taken.record.prev_hash == original_3.hash  # the chain goes on from its copy
    assert [len(v) for v in copies(appender.worm).values()] == [1, 1, 1, 1]
    found = anchor.examine(
        TENANT,
        appender.chain.records(TENANT),
        anchor.by_seq(appender.worm.originals(anchor.worm_prefix(TENANT)), anchor.worm_prefix(TENANT)),
        {},
        lambda *_: True,
    )
    assert [(f.kind, f.seq) for f in found.findings] == [("deleted", 2), ("deleted", 3), ("link", 4)]


def test_a_table_record_changed_before_the_redelivery_is_a_conflict_and_not_copied(stores):
    base, appender = stores
    base.faults.fail("worm.put_once", TimeoutError())
    with pytest.raises(TimeoutError):
        run(appender).take(intent())
    record = appender.chain.chains[TENANT][1]
    appender.chain.chains[TENANT][1] = record.model_copy(update={"outcome": "403"})
    invocation = run(appender)
    taken = invocation.take(intent())
    assert taken.outcome == "conflict" and copies(appender.worm) == {}
    assert invocation.checkpoint(TENANT) is None  # nothing signs the changed record


def test_chains_are_per_tenant(stores):
    _, appender = stores
    invocation = run(appender)
    invocation.take(intent(0, "acme"))
    invocation.take(intent(1, "globex"))
    assert [r.seq for r in appender.chain.records("globex")] == [1]
    assert set(invocation.heads) == {"acme", "globex"}


# --- chunk receipts ---------------------------------------------------------------------------
def counted(base, chunk: int = 0, **values) -> ChunkRecord:
    marker = ChunkRecord(
        tenant=TENANT,
        batch_id="batch_1",
        chunk=chunk,
        attempt="a0",
        completed=2,
        failed=1,
        recorded_at=T0,
        expires_at=T0 + 99,
        input_tokens=7,
        output_tokens=3,
        **values,
    )
    base.batches.markers[(TENANT, "batch_1", chunk)] = marker
    return marker


def test_a_receipt_takes_its_numbers_from_the_count_marker_not_the_sender(stores):
    base, appender = stores
    marker = counted(base)
    digest = hashlib.sha256(b"out").hexdigest()
    sent = audit.receipt_intent(message(0), marker, at=T0, digests={"out_sha256": digest, "err_sha256": None})
    forged = sent.model_copy(
        update={
            "at": 1,
            "actor": "operator",
            "outcome": "forged",
            "dedupe": "another-key",
            "details": sent.details | {"completed": 999, "usage": {"output_tokens": 0}, "attempt": "z9"},
        }
    )
    taken = run(appender).take(forged)
    record = taken.record
    assert_fields(record, at=T0, actor=audit.WORKER, outcome="ok", target="batch_1")
    assert record.details == {
        "batch": "batch_1",
        "chunk": 0,
        "attempt": "a0",
        "first_line": 1,
        "line_count": 2,
        "completed": 2,
        "failed": 1,
        "out_sha256": digest,
        "err_sha256": None,
        "usage": {"input_tokens": 7, "cached_tokens": 0, "output_tokens": 3, "reasoning_tokens": 0},
    }
    # Keyed on the chunk, whatever key the sender named: the honest receipt is a duplicate of it.
    assert run(appender).take(sent).outcome == "duplicate"
    assert len(appender.chain.records(TENANT)) == 1


def test_a_receipt_without_digests_hashes_the_counted_attempt_s_parts(stores):
    base, appender = stores
    marker = counted(base)
    base.objects.put(schema.chunk_part_key(TENANT, "batch_1", 0, "a0", "out"), b'{"id":"r1"}\n')
    record = run(appender).take(audit.receipt_intent(message(0), marker, at=T0)).record
    assert record.details["out_sha256"] == hashlib.sha256(b'{"id":"r1"}\n').hexdigest()
    assert record.details["err_sha256"] is None  # no error part


def test_a_redelivered_receipt_reads_no_part_and_no_marker(stores):
    base, appender = stores
    marker = counted(base)
    base.objects.put(schema.chunk_part_key(TENANT, "batch_1", 0, "a0", "out"), b"x")
    run(appender).take(audit.receipt_intent(message(0), marker, at=T0))
    before = (base.faults.calls["objects.iter_bytes"], base.faults.calls["batches.counted_chunk"])
    assert run(appender).take(audit.receipt_intent(message(0), marker, at=T0)).outcome == "duplicate"
    assert (base.faults.calls["objects.iter_bytes"], base.faults.calls["batches.counted_chunk"]) == before


@pytest.mark.parametrize(
    "details",
    [
        {"batch": "batch_1", "chunk": 5, "first_line": 1, "line_count": 2},  # a chunk never counted
        {"batch": "batch_1", "first_line": 1, "line_count": 2},  # no chunk
        {"batch": "batch_1", "chunk": 0, "first_line": "1", "line_count": 2},  # not a line number
        {"batch": "batch_1", "chunk": 0, "first_line": 1, "line_count": 2, "out_sha256": "not hex"},
    ],
)
def test_a_receipt_that_names_no_counted_chunk_is_refused(stores, details):
    base, appender = stores
    counted(base)
    sent = audit.AuditIntent(
        tenant=TENANT,
        at=T0,
        actor=audit.WORKER,
        action=audit.CHUNK_RECEIPT,
        outcome="ok",
        target="batch_1",
        details=details,
        dedupe="x",
    )
    taken = run(appender).take(sent)
    assert taken.outcome == "refused" and appender.chain.records(TENANT) == []


# --- the handler: FIFO partial failures, one checkpoint per tenant per invocation ---------------
def sqs_event(intents: list[audit.AuditIntent]) -> dict:
    return {
        "Records": [
            {
                "messageId": f"m-{i}",
                "receiptHandle": f"r-{i}",
                "body": it.model_dump_json(),
                "md5OfBody": "",
                "attributes": {
                    "MessageGroupId": it.tenant,
                    "ApproximateReceiveCount": "1",
                    "SequenceNumber": str(i),
                    "MessageDeduplicationId": str(i),
                    "SentTimestamp": "0",
                    "SenderId": "x",
                    "ApproximateFirstReceiveTimestamp": "0",
                },
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "awsRegion": "us-east-1",
                "eventSourceARN": "arn:aws:sqs:us-east-1:123456789012:audit.fifo",
            }
            for i, it in enumerate(intents)
        ]
    }


@pytest.fixture
def handler_stores(stores, monkeypatch):
    base, appender = stores
    monkeypatch.setattr(append_handler, "appender_stores", lambda: appender)
    return base, appender


def invoke(event: dict) -> list[str]:
    response = append_handler.handler(event, LocalLambdaContext("audit-append"))
    return [f["itemIdentifier"] for f in response["batchItemFailures"]]


def test_the_handler_signs_one_checkpoint_per_tenant_per_invocation(handler_stores):
    _, appender = handler_stores
    assert invoke(sqs_event([intent(i) for i in range(5)] + [intent(9, "globex")])) == []
    assert len(appender.chain.records(TENANT)) == 5
    checkpoints = sorted(k for k in appender.worm.versions if k.startswith(anchor.CHECKPOINT_PREFIX))
    assert checkpoints == [anchor.checkpoint_key(TENANT, 5), anchor.checkpoint_key("globex", 1)]


def test_a_tenant_s_intents_are_appended_together_in_one_transaction_and_copied_each(handler_stores):
    _, appender = handler_stores
    assert invoke(sqs_event([intent(0), intent(1), intent(2), intent(3, "globex")])) == []
    assert appender.chain.faults.calls["chain.put_many"] == 1 and appender.chain.faults.calls["chain.put"] == 1
    assert [r.seq for r in appender.chain.records(TENANT)] == [1, 2, 3]
    assert audit.verify(appender.chain.records(TENANT)) is None  # linked as one-by-one appends link them
    assert all(anchor.worm_key(TENANT, s) in appender.worm.versions for s in (1, 2, 3))
    assert anchor.checkpoint_key(TENANT, 3) in appender.worm.versions


def test_a_tenant_whose_transaction_fails_comes_back_whole_and_the_others_go_on(handler_stores):
    _, appender = handler_stores
    real = appender.chain.put_many

    def put_many(entries):
        if entries[0][0].tenant == TENANT:
            raise throttle()  # DynamoDB throttles acme's transaction: nothing of it written
        return real(entries)

    appender.chain.put_many = put_many
    event = sqs_event([intent(0), intent(1), intent(2), intent(3, "globex"), intent(4, "globex")])
    assert invoke(event) == ["m-0", "m-1", "m-2"]  # FIFO: acme's intents come back, in order
    assert appender.chain.records(TENANT) == []
    assert [r.seq for r in appender.chain.records("globex")] == [1, 2]
    assert anchor.checkpoint_key(TENANT, 1) not in appender.worm.versions


def test_a_failed_intent_fails_the_rest_of_its_tenant_only_and_the_tenant_is_checkpointed_up_to_it(handler_stores):
    """A duplicate among a tenant's intents refuses their transaction: they are taken one by one,
    and the one that then fails brings itself and the ones after it back."""
    _, appender = handler_stores
    assert invoke(sqs_event([intent(0)])) == []  # intent 0 appended: it comes again below
    event = sqs_event([intent(0), intent(1), intent(2), intent(3, "globex")])
    real_put = appender.chain.put
    calls = []

    def put(record, *, dedupe=None, charge=None):
        calls.append(record.tenant)
        if record.request_id == "req-1":  # acme's intent after the duplicate: DynamoDB throttles
            raise throttle()
        return real_put(record, dedupe=dedupe, charge=charge)

    appender.chain.put = put
    assert invoke(event) == ["m-1", "m-2"]  # FIFO: acme's failed intent and the one after it come back
    assert [r.seq for r in appender.chain.records(TENANT)] == [1]
    assert [r.seq for r in appender.chain.records("globex")] == [1]
    assert anchor.checkpoint_key(TENANT, 1) in appender.worm.versions
    assert anchor.checkpoint_key("globex", 1) in appender.worm.versions


def test_a_checkpoint_that_cannot_be_signed_brings_the_tenant_s_last_intent_back(handler_stores):
    base, appender = handler_stores
    signer = appender.signer

    class Failing:
        key_id = signer.key_id

        def sign(self, message: bytes) -> bytes:
            raise TimeoutError("KMS did not answer")

        def public_key(self) -> bytes:
            return signer.public_key()

    broken = AppenderStores(
        chain=appender.chain, worm=appender.worm, signer=Failing(), batches=base.batches, objects=base.objects
    )
    append_handler.appender_stores = lambda: broken  # monkeypatched back by the fixture
    assert invoke(sqs_event([intent(0), intent(1)])) == ["m-1"]
    assert len(appender.chain.records(TENANT)) == 2  # appended and copied; only the checkpoint waits
    append_handler.appender_stores = lambda: appender
    assert invoke(sqs_event([intent(1)])) == []  # the redelivery: a duplicate, and the checkpoint
    assert anchor.checkpoint_key(TENANT, 2) in appender.worm.versions


def test_a_message_that_is_no_intent_is_dropped(handler_stores):
    _, appender = handler_stores
    event = sqs_event([intent(0)])
    event["Records"][0]["body"] = "{not json"
    assert invoke(event) == [] and appender.chain.records(TENANT) == []
