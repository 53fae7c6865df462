"""``batchctl tenants get`` shows what a tenant's caps and budget have used (docs/governance.md):
per capped model the enqueued requests and tokens, and the current period's charged output tokens,
read from the counter items the API, ingest and the audit appender write (moto)."""

import json
import time

from functions.core import lifecycle
from functions.core.records import ChunkRecord
from functions.core.tenants import Reservation, TenantPolicy, budget_sk
from tests.builders import batch_record
from tests.integration.batch_helpers import count_and_charge
from tests.integration.test_tenants_cli import env, run_cli, stack


def test_get_shows_enqueued_and_budget_usage(stack: None, env: dict[str, str], stores, appender) -> None:
    stores.tenants.put(TenantPolicy(tenant="acme", max_enqueued_tokens={"test-chat": 5000}, output_token_budget=900))
    stores.batches.create(batch_record(id="b1", created_at=1, expires_at=10**10, input_key="k"))
    stores.batches.transition(
        "acme",
        "b1",
        lifecycle.start(
            1,
            values={"chunk_count": 1},
            reservation=Reservation(tenant="acme", model="test-chat", requests=3, tokens=120, max_tokens=5000),
        ),
    )
    now = int(time.time())
    count_and_charge(
        stores,
        appender,
        ChunkRecord(
            tenant="acme",
            batch_id="b1",
            chunk=0,
            attempt="a",
            completed=3,
            failed=0,
            output_tokens=42,
            recorded_at=now,
            expires_at=10**10,
            budget_period="month",
        ),
    )
    code, out, err = run_cli("tenants", "get", "--tenant", "acme", env=env)
    assert code == 0, err
    usage = json.loads(out)["usage"]
    assert usage["enqueued"] == {"test-chat": {"requests": 3, "tokens": 120}}
    assert usage["budget"] == {"period": budget_sk("month", now), "output_tokens": 42, "input_tokens": 0}


def test_get_of_a_tenant_without_limits_shows_only_its_stored_bytes(stack: None, env: dict[str, str]) -> None:
    # Every tenant's stored bytes are counted (a quota set later starts from what it holds).
    code, out, err = run_cli("tenants", "get", "--tenant", "nobody", env=env)
    assert code == 0, err
    assert json.loads(out)["usage"] == {"enqueued": {}, "stored_bytes": 0}
