"""The GPU scaler's decision (functions/scaler/logic.py): scale out from zero on the queue alone,
grow with the backlog up to max_tasks, scale in one task at a time with hysteresis and a cooldown,
never under a draining task, and back to zero only after the idle period."""

import pytest

from functions.scaler.logic import Observation, ScaledService, State, decide, run

T = 20
SERVICE = ScaledService(
    model="m",
    cluster="c",
    service="s",
    queue_url="q",
    min_tasks=0,
    max_tasks=3,
    backlog_per_task=T,
    idle_seconds=15 * 60,
    scale_in_cooldown_seconds=5 * 60,
)
NOW = 1_800_000_000


def desired(
    visible: int,
    in_flight: int,
    tasks: int,
    *,
    running: int | None = None,
    state: State = State(),
    now: int = NOW,
    service: ScaledService = SERVICE,
) -> int:
    return decide(
        Observation(tasks, tasks if running is None else running, visible, in_flight), state, service, now
    ).desired


# --- the three cases the scaler exists for (docs/deploy.md, "Scaling") ----------------------------
def test_zero_tasks_messages_waiting_scales_out_at_once():
    """No task, no Container Insights datapoint: the queue alone starts the first GPU, immediately."""
    assert desired(1, 0, 0) == 1
    assert desired(T - 1, 0, 0) == 1
    assert desired(T, 0, 0) == 2  # each task under T
    assert desired(10 * T, 0, 0) == 3  # capped at max_tasks
    # ...even from a fresh idle record and right after a scale-in (scale-out has no cooldown).
    assert desired(1, 0, 0, state=State(idle_since=NOW - 10, scaled_in_at=NOW - 1)) == 1


def test_tasks_busy_backlog_growing_adds_tasks_up_to_max():
    assert desired(T - 1, 0, 1) == 1
    assert desired(T - 1, T, 2) == 2
    assert desired(T, T, 2) == 3  # T per task: one more
    assert desired(10 * T, 0, 1) == 3
    assert desired(10 * T, 5, 3) == 3  # never above max_tasks
    big = SERVICE.model_copy(update={"max_tasks": 8})
    assert desired(3 * T, 2 * T, 1, service=big) == 6  # absolute target: straight to what the backlog needs


def test_backlog_empty_for_the_idle_period_returns_to_zero():
    state = State(idle_since=NOW - 15 * 60)
    assert desired(0, 0, 2, state=state) == 0
    assert desired(0, 0, 0, state=state) == 0
    # Not yet: one second short of the idle period keeps the tasks.
    assert desired(0, 0, 2, state=State(idle_since=NOW - 15 * 60 + 1)) == 2


def test_idle_clock_starts_when_the_backlog_empties_and_resets_with_work():
    first = decide(Observation(2, 2, 0, 0), State(), SERVICE, NOW)
    assert first.desired == 2 and first.state.idle_since == NOW
    kept = decide(Observation(2, 2, 0, 0), first.state, SERVICE, NOW + 600)
    assert kept.state.idle_since == NOW and kept.desired == 2
    busy = decide(Observation(2, 2, T, 0), kept.state, SERVICE, NOW + 700)
    assert busy.state.idle_since is None and busy.desired == 2
    again = decide(Observation(2, 2, 0, 0), busy.state, SERVICE, NOW + 15 * 60 + 1)
    assert again.state.idle_since == NOW + 15 * 60 + 1 and again.desired == 2  # the period starts over


def test_in_flight_chunks_keep_the_last_task():
    """Running chunks are backlog: the task running them is not removed, even after the idle period."""
    old_idle = State(idle_since=NOW - 3600)
    assert desired(0, 3, 1, state=old_idle) == 1
    assert desired(0, 1, 1) == 1


def test_scale_in_one_task_at_a_time_with_hysteresis():
    assert desired(1, 2, 3) == 2  # 3 chunks, 2 tasks would each have under T/2
    assert desired(0, T, 2) == 2  # one task fewer would hold T: keep
    assert desired(0, T // 2, 2) == 2  # exactly T/2 for the one left: keep (under, not at)
    assert desired(0, T // 2 - 1, 2) == 1
    assert desired(5, 0, 1) == 1  # never the last task while chunks wait


def test_scale_in_waits_for_the_cooldown():
    just = State(scaled_in_at=NOW - 5 * 60 + 1)
    assert desired(1, 2, 3, state=just) == 3
    assert desired(1, 2, 3, state=State(scaled_in_at=NOW - 5 * 60)) == 2
    done = decide(Observation(3, 3, 1, 2), State(), SERVICE, NOW)
    assert done.desired == 2 and done.state.scaled_in_at == NOW


def test_no_scale_in_while_a_task_is_draining():
    """After a scale-in the stopped task drains (SIGTERM) and still runs: wait until it is gone."""
    assert desired(1, 2, 2, running=3) == 2
    assert desired(1, 2, 2, running=2) == 1


def test_min_tasks_is_a_floor():
    warm = SERVICE.model_copy(update={"min_tasks": 1})
    assert desired(0, 0, 1, state=State(idle_since=NOW - 3600), service=warm) == 1
    assert desired(0, 0, 0, state=State(idle_since=NOW - 3600), service=warm) == 1
    assert desired(1, 0, 1, service=warm) == 1


# --- run: observe, decide, apply -------------------------------------------------------------------
class Fakes:
    def __init__(self, desired: int, running: int, visible: int, in_flight: int, state: dict | None = None):
        self.desired, self.running, self.visible, self.in_flight = desired, running, visible, in_flight
        self.state = dict(state or {})
        self.updates: list[int] = []
        self.saves = 0

    def counts(self, cluster, service):
        assert (cluster, service) == ("c", "s")
        return self.desired, self.running

    def set_desired(self, cluster, service, desired):
        self.updates.append(desired)
        self.desired = desired

    def depth(self, queue_url):
        assert queue_url == "q"
        return self.visible, self.in_flight

    def load(self, model):
        return dict(self.state)

    def save(self, model, values):
        self.saves += 1
        self.state = dict(values)


def test_run_sets_the_count_once_and_remembers_the_idle_clock():
    fakes = Fakes(desired=0, running=0, visible=3, in_flight=0)
    assert run(SERVICE, services=fakes, queues=fakes, states=fakes, now=NOW).desired == 1
    assert fakes.updates == [1]
    run(SERVICE, services=fakes, queues=fakes, states=fakes, now=NOW + 1)
    assert fakes.updates == [1]  # no change, no UpdateService
    fakes.visible = 0
    run(SERVICE, services=fakes, queues=fakes, states=fakes, now=NOW + 60)
    assert fakes.state == {"idle_since": NOW + 60} and fakes.updates == [1]
    run(SERVICE, services=fakes, queues=fakes, states=fakes, now=NOW + 60 + 15 * 60)
    assert fakes.updates == [1, 0]


@pytest.mark.parametrize("bad", [{"max_tasks": 0}, {"backlog_per_task": 0}, {"min_tasks": -1}])
def test_service_settings_are_validated(bad):
    with pytest.raises(ValueError):
        ScaledService.model_validate(SERVICE.model_dump() | bad)
    assert ScaledService.model_validate(SERVICE.model_dump()) == SERVICE
