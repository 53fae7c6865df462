"""The engine's prefix cache partitioned by tenant (gpu_worker/shaping.py): every request the worker
sends carries its tenant's salt (a tenant's own value replaced), the same for the same tenant and
secret and different across tenants; smart order groups shared prefixes within a tenant only; and
a line without an output limit is sent with its share of the line bound."""

import asyncio
import json

import pytest

from gpu_worker.admission import ORDER_SMART, Admission
from gpu_worker.shaping import CACHE_SALT_FIELD, PRIORITY_FIELD, CacheSalts, preparer
from tests.chunks import process_chunk
from tests.fakes.aws import fake_stores
from tests.fakes.engine import InProcessEngine
from tests.unit.test_worker_loop import seed


async def direct(fn, *args, **kwargs):
    return fn(*args, **kwargs)


def test_a_tenants_salt_is_stable_under_one_secret_and_unlike_any_other():
    salts, again = CacheSalts("deployment-secret"), CacheSalts("deployment-secret")
    assert salts.of("acme") == again.of("acme")
    assert salts.of("acme") != salts.of("globex")
    assert salts.of("acme") != CacheSalts("another-secret").of("acme")  # not guessable from the name
    assert len(salts.of("acme")) == 64 and all(c in "0123456789abcdef" for c in salts.of("acme"))  # vLLM's rules
    assert CacheSalts().of("acme") != CacheSalts().of("acme")  # no secret: a random one per worker


def test_every_line_sent_carries_its_tenants_salt_and_never_its_own():
    stores = fake_stores()
    (message,) = seed(stores, 3, per_chunk=3)
    engine = InProcessEngine()
    salts = CacheSalts("s")

    def hostile(raw):  # the tenant sets a salt of its own (another tenant's, say)
        obj = json.loads(raw)
        obj["body"][CACHE_SALT_FIELD] = salts.of("globex")
        return json.dumps(obj)

    key = message.input_key
    data = b"".join((hostile(line) + "\n").encode() for line in stores.objects.get(key).decode().splitlines())
    stores.objects.put(key, data)
    message = message.model_copy(update={"byte_end": len(data)})
    asyncio.run(
        process_chunk(stores, message, engine, io=direct, max_line_bytes=1 << 20, now=lambda: 1000, salts=salts)
    )
    assert [body[CACHE_SALT_FIELD] for _, body in engine.requests] == [salts.of("acme")] * 3


@pytest.mark.parametrize("tagged", [True, False])
def test_a_line_s_priority_is_the_worker_s_never_the_tenant_s(tagged):
    """A tenant that sets vLLM's ``priority`` to jump the engine's queue: removed; with an engine
    that schedules by priority, every line carries the worker's fair tag instead."""
    from gpu_worker.admission import FairTags

    stores = fake_stores()
    (message,) = seed(stores, 3, per_chunk=3)
    engine = InProcessEngine()
    key = message.input_key
    lines = stores.objects.get(key).decode().splitlines()
    data = b"".join(
        (json.dumps({**(o := json.loads(l)), "body": {**o["body"], PRIORITY_FIELD: -1000}}) + "\n").encode()
        for l in lines
    )
    stores.objects.put(key, data)
    message = message.model_copy(update={"byte_end": len(data)})
    admission = Admission(4, ORDER_SMART, tags=FairTags() if tagged else None)
    asyncio.run(
        process_chunk(stores, message, engine, io=direct, max_line_bytes=1 << 20, now=lambda: 1000, admission=admission)
    )
    sent = [body.get(PRIORITY_FIELD) for _, body in engine.requests]
    assert sent == ([1, 2, 3] if tagged else [None, None, None])


def test_the_output_bound_is_given_to_a_line_without_a_limit_only():
    (message,) = seed(fake_stores(), 1, per_chunk=1)
    prepare = preparer(message.model_copy(update={"max_line_output_tokens": 100}), None)
    assert prepare({"messages": [], "n": 4}) == {"messages": [], "n": 4, "max_completion_tokens": 25}
    assert prepare({"messages": [], "max_tokens": 7}) == {"messages": [], "max_tokens": 7}  # its own, checked at ingest
    assert preparer(message, None)({"messages": []}) == {"messages": []}  # no bound, no salt: as it is


def test_smart_order_groups_a_shared_first_message_within_a_tenant_only():
    admission = Admission(capacity=1, order=ORDER_SMART)
    system = {"messages": [{"role": "system", "content": "the same long system prompt"}]}
    first_a = admission.key(system, "acme")
    other = admission.key({"messages": [{"role": "user", "content": "unrelated"}]}, "acme")
    second_a = admission.key(system, "acme")
    from_b = admission.key(system, "globex")
    assert second_a[1] == first_a[1]  # behind acme's own group
    assert from_b[1] != first_a[1] and from_b[1] > other[1]  # globex's copy starts a group of its own
