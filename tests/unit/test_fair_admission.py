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
