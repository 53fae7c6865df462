"""The audit chain against a writer of the table (docs/audit.md, "What an attacker can still do"),
on the local deployment: tenants make audited calls through the official SDK; the appender (its
own role: the only writer of the chains) appends them moments later, copies each to the Object
Lock bucket and signs checkpoints with a key outside moto. Then an attacker with what table write
access gives (direct moto access) rewrites one tenant's chain from a record on, recomputing every
later hash, and cuts another tenant's tail: ``batchctl audit verify`` passes the untouched chain
and reports each (exit 1); a call after the cut is appended after the copies, never over them;
a checkpoint the attacker signs with a key of its own is reported as forged."""

import io
import re
import time

import boto3
import openai
import pytest
from openai import OpenAI

from batchctl import cli
from functions.core import anchor, audit, schema
from infra.local import state as local_state

from .conftest import LocalDeployment
from .target import eventually

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.local_only("plays an attacker with direct access to the local deployment's moto"),
]

#: How long the appender may take to append what was sent (it is woken at once by each send).
APPEND_WITHIN = 30.0


def verify(local: LocalDeployment, tenant: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--local", "audit", "verify", "--tenant", tenant], env=local.env, out=out, err=err)
    return code, out.getvalue() + err.getvalue()


def audited_calls(sdk: OpenAI) -> int:
    """Mutating calls (and one refusal): six records; reads add none."""
    file = sdk.files.create(
        file=(
            "in.jsonl",
            io.BytesIO(
                b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}\n'
            ),
        ),
        purpose="batch",
    )
    other = sdk.files.create(file=("notes.txt", io.BytesIO(b"notes")), purpose="user_data")
    sdk.files.list()
    sdk.files.delete(other.id)
    batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
    sdk.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        sdk.batches.cancel("batch_nope")
    return 6


def anchored(local: LocalDeployment, tenant: str, records: int) -> bool:
    """The chain verifies with ``records`` records, all copied and under a signed checkpoint."""
    code, text = verify(local, tenant)
    return (
        code == 0 and f": {records} records, {records} WORM copies, newest signed checkpoint at seq {records}:" in text
    )


def moto_table(local: LocalDeployment):
    state = local.state
    return boto3.resource(
        "dynamodb",
        endpoint_url=state.moto_endpoint,
        region_name=state.region,
        aws_access_key_id=local_state.ACCESS_KEY_ID,
        aws_secret_access_key=local_state.SECRET_ACCESS_KEY,
    ).Table(state.table_name)


def chain_items(table, tenant: str) -> list[dict]:
    return table.query(
        KeyConditionExpression="pk = :pk AND begins_with(sk, :seq)",
        ConsistentRead=True,
        ExpressionAttributeValues={":pk": schema.audit_pk(tenant), ":seq": schema.AUDIT_SEQ_PREFIX},
    )["Items"]


def tenant_for(request: pytest.FixtureRequest, role: str) -> str:
    return f"e2e-audit-{role}-" + re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[-20:]


def test_a_rewritten_chain_and_a_cut_tail_are_reported_and_the_untouched_chain_passes(local: LocalDeployment, request):
    rewritten, cut, untouched = (tenant_for(request, r) for r in ("rw", "cut", "ok"))
    sdks = {t: local.client(local.new_key(t)) for t in (rewritten, cut, untouched)}
    counts = {t: audited_calls(sdk) for t, sdk in sdks.items()}
    for tenant, n in counts.items():
        assert eventually(lambda: anchored(local, tenant, n), within=APPEND_WITHIN, interval=0.25), verify(
            local, tenant
        )

    table = moto_table(local)
    # The attacker rewrites the rewritten tenant's record 2 (its outcome) and every later hash.
    prev = audit.GENESIS
    for item in chain_items(table, rewritten):
        record = audit.AuditRecord.model_validate_json(item["record"])
        if record.seq >= 2:
            content = record.content() | ({"outcome": "403"} if record.seq == 2 else {})
            record = audit.link(content.pop("tenant"), record.seq, prev, **content)
            table.put_item(Item={**item, "record": record.to_json()})
        prev = record.hash
    records = [audit.AuditRecord.model_validate_json(i["record"]) for i in chain_items(table, rewritten)]
    assert audit.verify(records) is None  # the hash links alone hold
    code, text = verify(local, rewritten)
    assert code == 1, text
    assert "seq 2: rewritten: differs from its WORM copy" in text and "seq 5: rewritten" in text

    # The attacker deletes the cut tenant's last record.
    last = counts[cut]
    table.delete_item(Key={schema.PK: schema.audit_pk(cut), schema.SK: schema.audit_seq_sk(last)})
    code, text = verify(local, cut)
    assert code == 1 and f"seq {last}: cut_tail" in text and f"beyond the table's head (seq {last - 1})" in text

    # The untouched chain still passes.
    assert verify(local, untouched)[0] == 0

    # A call after the cut: the appender goes on after the copy it kept, never over it.
    sdks[cut].files.create(file=("more.txt", io.BytesIO(b"more")), purpose="user_data")

    def appended_after_the_cut() -> bool:
        return any(audit.AuditRecord.model_validate_json(i["record"]).seq == last + 1 for i in chain_items(table, cut))

    assert eventually(appended_after_the_cut, within=APPEND_WITHIN, interval=0.25)
    code, text = verify(local, cut)
    assert code == 1 and f"seq {last}: deleted" in text and f"seq {last + 1}: link" in text
    assert f"newest signed checkpoint at seq {last + 1}" in text

    # A checkpoint the attacker signs with a key of its own (it has moto, not the key file).
    from tests.fakes.aws import KeySigner

    state = local.state
    s3 = boto3.client(
        "s3",
        endpoint_url=state.moto_endpoint,
        region_name=state.region,
        aws_access_key_id=local_state.ACCESS_KEY_ID,
        aws_secret_access_key=local_state.SECRET_ACCESS_KEY,
    )
    head = audit.AuditRecord.model_validate_json(chain_items(table, untouched)[-1]["record"])
    forged = anchor.Checkpoint(tenant=untouched, seq=head.seq + 1, hash="f" * 64, at=int(time.time()), key_id="forged")
    body = anchor.signed(forged, KeySigner().sign(forged.message())).to_json().encode()
    s3.put_object(
        Bucket=state.audit_bucket_name,
        Key=anchor.checkpoint_key(untouched, head.seq + 1),
        Body=body,
        IfNoneMatch="*",
        ChecksumAlgorithm="SHA256",
    )
    code, text = verify(local, untouched)
    assert code == 1 and f"seq {head.seq + 1}: forged_checkpoint" in text
