"""Names and numbers shared by the Lambdas, the worker and whoever builds their resources (the CDK
stack and the local deployment, in ``infra``), defined once.

``functions`` and ``gpu_worker`` take them from here; ``infra`` imports them (never the other way:
``tests/unit/test_imports.py``). Names that only ``infra`` uses (the stack, its outputs, the local
deployment) live in ``infra/names.py``.
"""

import re
from typing import Final

from .schema import BATCHES_PREFIX

__all__ = [
    "AUDIT_APPEND_TIMEOUT_SECONDS",
    "AUDIT_MAX_RECEIVES",
    "AUDIT_VISIBILITY_SECONDS",
    "BATCHES_PREFIX",
    "EVENT_SOURCE",
    "INGEST_MAX_RECEIVES",
    "METRICS_NAMESPACE",
    "WORK_MAX_RECEIVES",
    "WORK_VISIBILITY_SECONDS",
    "audit_dead_letter_queue_name",
    "audit_queue_name",
    "dead_letter_queue_name",
    "event_bus_name",
    "ingest_queue_name",
    "model_slug",
    "state_machine_name",
    "work_queue_name",
]

#: The EventBridge ``source`` of every batch event (the README promises ``batch-api``).
EVENT_SOURCE: Final = "batch-api"

#: The CloudWatch namespace of the stack's own metrics (batches by status, dropped webhook events).
METRICS_NAMESPACE: Final = "BatchApi"


def event_bus_name(prefix: str) -> str:
    """The deployment's own event bus, where the batch lifecycle events go (docs/webhooks.md,
    "Who may publish"): its resource policy admits the stack's publishers only."""
    return f"{prefix}-batch-events"


# --- Queues and workflow (the stack and the local deployment name them alike) -------------------
#: After this many receives a work message goes to its queue's DLQ: the last resort only. A
#: chunk's poison budget is recorded by the workers (``limits.CHUNK_MAX_STRIKES`` /
#: ``CHUNK_MAX_FAILURES``, real failures only), so benign releases (shutdown, engine restarts,
#: store errors) must not reach this: it is far above the budget.
WORK_MAX_RECEIVES: Final = 50
#: After this many receives an ingest event goes to the ingest DLQ.
INGEST_MAX_RECEIVES: Final = 5
#: Work messages stay invisible this long per receive; the worker extends it while a chunk runs.
WORK_VISIBILITY_SECONDS: Final = 120


#: The audit appender's time limit per batch of intents (at most 10 on a FIFO queue), the audit
#: queue's visibility (six times it, as AWS advises for a queue that feeds a function), and the
#: receives after which an intent goes to the audit DLQ (alarmed; a redrive appends it).
AUDIT_APPEND_TIMEOUT_SECONDS: Final = 30
AUDIT_VISIBILITY_SECONDS: Final = 6 * AUDIT_APPEND_TIMEOUT_SECONDS
AUDIT_MAX_RECEIVES: Final = 10


def model_slug(model: str) -> str:
    """A model name as it may appear in resource names."""
    return re.sub(r"[^A-Za-z0-9-]+", "-", model).strip("-")[:40]


def work_queue_name(prefix: str, model: str) -> str:
    return f"{prefix}-work-{model_slug(model)}"


def dead_letter_queue_name(queue_name: str) -> str:
    return f"{queue_name}-dlq"


def audit_queue_name(prefix: str) -> str:
    """The audit queue: FIFO, so its name ends in ``.fifo`` (as its DLQ's must)."""
    return f"{prefix}-audit.fifo"


def audit_dead_letter_queue_name(prefix: str) -> str:
    return f"{prefix}-audit-dlq.fifo"


def ingest_queue_name(prefix: str) -> str:
    return f"{prefix}-ingest"


def state_machine_name(prefix: str) -> str:
    return f"{prefix}-batch"
