"""The GPU services' scaler, without the Lambda around it: what desired task count a model's ECS
service should have, from its work queue's backlog (docs/worker.md, "Scaling").

Why not Application Auto Scaling on CloudWatch alarms: the per-task ratio needs the service's task
count, and Container Insights publishes no datapoint for a service at zero tasks; an alarm also
evaluates whole one-minute periods of metrics that arrive minutes late. The scaler reads the two
numbers that exist at zero tasks, straight from their APIs (SQS GetQueueAttributes, ECS
DescribeServices), and is run by the event that enqueues work as well as every minute.

The rule, with ``backlog = visible + in_flight`` (chunks waiting or running) and ``T`` the model's
``backlog_per_task``:

- backlog > 0: at least ``floor(backlog / T) + 1`` tasks (each under T), at most ``max_tasks``;
  scale-out is immediate and absolute (running it twice changes nothing);
- scale in by one task only when, with one task fewer, each remaining task would still have under
  T/2 (hysteresis against the scale-out at T), at most once per ``scale_in_cooldown_seconds``,
  never while a task is still draining from a previous scale-in (running > desired), and never
  the last task while chunks wait or run (in-flight chunks are backlog);
- backlog == 0 for ``idle_seconds``: down to ``min_tasks`` (usually 0: no GPU while idle).

``decide`` is pure; ``run`` applies it to one service through the ports below.
"""

from dataclasses import asdict, dataclass
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

#: Scale in while one task fewer would leave each remaining task under this fraction of T.
SCALE_IN_FRACTION = 0.5


class ScaledService(BaseModel):
    """One model's service and how it scales (from the deployment config)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    cluster: str
    service: str
    queue_url: str
    min_tasks: int = Field(ge=0)
    max_tasks: int = Field(ge=1)
    backlog_per_task: int = Field(ge=1)
    idle_seconds: int = Field(ge=0)
    scale_in_cooldown_seconds: int = Field(ge=0)


@dataclass(frozen=True)
class Observation:
    """What the scaler reads: the service's desired and running task counts, and the queue."""

    desired: int
    running: int
    visible: int
    in_flight: int

    @property
    def backlog(self) -> int:
        return self.visible + self.in_flight


@dataclass(frozen=True)
class State:
    """What the scaler remembers between runs: since when the backlog is empty (None while it is
    not), and when it last scaled in (None: never)."""

    idle_since: int | None = None
    scaled_in_at: int | None = None


@dataclass(frozen=True)
class Decision:
    desired: int
    state: State
    reason: str


def needed_tasks(backlog: int, per_task: int) -> int:
    """Tasks so that each has under ``per_task`` chunks: 0 for no backlog."""
    return backlog // per_task + 1 if backlog > 0 else 0


def decide(observed: Observation, state: State, service: ScaledService, now: int) -> Decision:
    """The desired task count for ``service`` now, and the state to remember."""
    lo, hi, t = service.min_tasks, service.max_tasks, service.backlog_per_task
    current = observed.desired

    def clamp(n: int) -> int:
        return max(lo, min(hi, n))

    if observed.backlog == 0:
        idle_since = state.idle_since if state.idle_since is not None else now
        kept = State(idle_since=idle_since, scaled_in_at=state.scaled_in_at)
        target = lo if now - idle_since >= service.idle_seconds else clamp(current)
        reason = "idle" if target != current else "steady" if current == lo else "waiting for idle period"
        return Decision(target, kept, reason)

    busy = State(idle_since=None, scaled_in_at=state.scaled_in_at)
    needed = clamp(needed_tasks(observed.backlog, t))
    if needed > current:
        return Decision(needed, busy, "scale out")
    fewer = current - 1
    underused = fewer >= 1 and observed.backlog < fewer * t * SCALE_IN_FRACTION
    draining = observed.running > current
    cooled = state.scaled_in_at is None or now - state.scaled_in_at >= service.scale_in_cooldown_seconds
    if underused and not draining and cooled and fewer >= lo:
        return Decision(fewer, State(idle_since=None, scaled_in_at=now), "scale in")
    return Decision(clamp(current), busy, "steady")


# --- ports -----------------------------------------------------------------------------------------
class Services(Protocol):
    def counts(self, cluster: str, service: str) -> tuple[int, int]:
        """(desired, running) task counts of the service."""
        ...

    def set_desired(self, cluster: str, service: str, desired: int) -> None: ...


class QueueDepth(Protocol):
    def depth(self, queue_url: str) -> tuple[int, int]:
        """(visible, in flight) messages of the queue."""
        ...


class ScalerState(Protocol):
    """The remembered ``State`` of each model, as plain fields (absent = None)."""

    def load(self, model: str) -> dict[str, int]: ...
    def save(self, model: str, values: dict[str, int]) -> None: ...


def run(service: ScaledService, *, services: Services, queues: QueueDepth, states: ScalerState, now: int) -> Decision:
    """Observe, decide, apply: sets the desired count only when it changes, then saves the state."""
    desired, running = services.counts(service.cluster, service.service)
    visible, in_flight = queues.depth(service.queue_url)
    before = State(**states.load(service.model))
    decision = decide(Observation(desired, running, visible, in_flight), before, service, now)
    if decision.desired != desired:
        services.set_desired(service.cluster, service.service, decision.desired)
    if decision.state != before:
        states.save(service.model, {k: v for k, v in asdict(decision.state).items() if v is not None})
    return decision
