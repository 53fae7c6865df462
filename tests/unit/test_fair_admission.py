"""Fair share inside one worker (docs/governance.md, "Fair share"): ``Admission.fair_slot`` lets a tenant that
holds fewer lines than the biggest tenant enter the engine before the big tenant's waiting lines,
in either order; one tenant alone keeps its order."""

import asyncio

import pytest

from gpu_worker.admission import ORDER_FILE, ORDER_SMART, Admission


def entries(order: str, arrivals: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Capacity 1, held by a first line of tenant "a"; then ``arrivals`` (tenant, max_tokens) queue
    up one after the other; the holder leaves: the order the queued lines enter in."""
    admission = Admission(1, order)
    entered: list[tuple[str, int]] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def line(tenant: str, tokens: int, hold: asyncio.Event | None = None) -> None:
            async with admission.fair_slot({"max_tokens": tokens}, owner=tenant, group=tenant):
                if hold is not None:
                    await hold.wait()
                else:
                    entered.append((tenant, tokens))

        holder = asyncio.create_task(line("a", 0, release))
        await asyncio.sleep(0)
        tasks = []
        for tenant, tokens in arrivals:
            tasks.append(asyncio.create_task(line(tenant, tokens)))
            await asyncio.sleep(0)
        assert admission.waiting == len(arrivals)
        release.set()
        await asyncio.gather(holder, *tasks)

    asyncio.run(scenario())
    return entered


@pytest.mark.parametrize("order", [ORDER_FILE, ORDER_SMART])
def test_a_small_tenant_enters_before_the_giants_waiting_lines(order: str) -> None:
    a = [("a", 8)] * 6
    assert entries(order, [*a, ("b", 8), ("b", 8)]) == [("b", 8), ("b", 8), *a]


def test_one_tenant_alone_keeps_the_smart_order() -> None:
    assert entries(ORDER_SMART, [("a", 8), ("a", 512), ("a", 64)]) == [("a", 512), ("a", 64), ("a", 8)]


def test_within_the_quiet_tenant_the_smart_order_still_holds() -> None:
    got = entries(ORDER_SMART, [("a", 8)] * 4 + [("b", 8), ("b", 512)])
    assert got[:2] == [("b", 512), ("b", 8)]


# --- the engine's own queue: tags and the reserve -------------------------------------------------
def test_tags_put_a_newcomer_ahead_of_what_another_tenant_has_waiting_never_ahead_of_what_runs() -> None:
    from gpu_worker.admission import FairTags

    tags = FairTags()
    a = [tags.open("a") for _ in range(6)]  # a's lines in the engine: 2 running, 4 waiting there
    assert a == [1, 2, 3, 4, 5, 6]
    b = [tags.open("b") for _ in range(3)]
    assert b == [2, 3, 4]  # right after a's oldest line still in the engine, ahead of a's waiting ones
    assert tags.open("a") == 7  # a goes on from its own
    for t in (*a[:2], *b):
        tags.close(t)
    assert tags.floor() == 3
    # Idle, b earns nothing: it restarts at the oldest line still in the engine, not at its old 4.
    for t in (*a[2:], 7):
        tags.close(t)
    assert tags.floor() == 7 and tags.open("b") == 8


def test_two_busy_tenants_interleave_in_the_engine_s_queue() -> None:
    from gpu_worker.admission import FairTags

    tags = FairTags()
    order = sorted([(tags.open("a"), "a") for _ in range(3)] + [(tags.open("b"), "b") for _ in range(3)])
    assert [t for _, t in order] == ["a", "a", "b", "a", "b", "b"]  # ties go by arrival, as in vLLM


def test_forgotten_tenants_restart_where_they_would_anyway() -> None:
    from gpu_worker.admission import FairTags

    tags = FairTags()
    tags.MAX_TENANTS = 3
    for tenant in ("a", "b", "c"):
        tags.close(tags.open(tenant))
    assert tags.open("d") == 4  # the map was pruned of the tenants behind the floor
    assert len(tags._last) <= 3


def test_the_reserve_lets_a_newcomer_in_at_once_and_only_within_it() -> None:
    """Capacity 2 held by tenant a, which has two more lines waiting; b's lines pass a's waiting
    lines within the reserve of 1 (b holds fewer lines than a), then wait in their turn."""
    admission = Admission(2, ORDER_FILE, reserve=1)
    entered: list[str] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def line(tenant: str) -> None:
            async with admission.fair_slot({}, owner=tenant, group=tenant):
                entered.append(tenant)
                await release.wait()

        tasks = [asyncio.create_task(line("a")) for _ in range(4)]
        await asyncio.sleep(0)
        assert entered == ["a", "a"] and admission.waiting == 2
        tasks += [asyncio.create_task(line("b")) for _ in range(2)]
        await asyncio.sleep(0)
        assert entered == ["a", "a", "b"] and admission.in_flight == 3  # the second b waits: reserve spent
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert entered[3] == "b"  # first in line when slots free, before a's waiting lines
    assert admission.in_flight == 0


def test_each_line_carries_its_tag_while_it_is_in_the_engine() -> None:
    from gpu_worker.admission import FairTags

    admission = Admission(4, ORDER_FILE, tags=FairTags())
    seen: list[int | None] = []

    async def scenario() -> None:
        async with admission.fair_slot({}, owner="x", group="a") as first:
            seen.append(first)
            async with admission.fair_slot({}, owner="y", group="b") as second:
                seen.append(second)
        async with admission.fair_slot({}, owner="x", group="a") as third:
            seen.append(third)

    asyncio.run(scenario())
    assert seen == [1, 2, 3]  # b right after a's oldest in the engine; then past every tag given
    assert Admission(1).tags is None
