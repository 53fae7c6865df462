"""Structured logs and CloudWatch metrics for the worker (a container, not a Lambda).

Logs: powertools ``Logger`` (JSON lines on stdout; the awslogs driver ships them). Metrics:
powertools ``Metrics`` writes CloudWatch Embedded Metric Format records to stdout; CloudWatch Logs
turns them into metrics, no agent or API call needed. A Lambda flushes per invocation; the worker
flushes every ``metrics_interval_seconds`` and on exit, so each metric is a per-interval sum
(rates are those sums over the interval, also logged as lines/s and tokens/s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from .engine_client import EngineStats


@dataclass
class Totals:
    chunks_done: int = 0
    chunks_skipped: int = 0
    chunks_released: int = 0
    chunks_failed: int = 0
    chunks_redelivered: int = 0
    lines_completed: int = 0
    lines_failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    #: Chunks run in careful mode; lines taken from checkpoints (not run again); engine_crashed lines.
    chunks_careful: int = 0
    lines_reused: int = 0
    lines_crashed: int = 0


_ENGINE_COUNTERS = ("requests", "retries", "timeouts", "connection_errors", "overloaded")


class WorkerMetrics:
    def __init__(
        self, *, namespace: str, service: str, logger: Logger, model: str, clock: Callable[[], float] = time.monotonic
    ):
        self.logger = logger
        self.totals = Totals()
        self._metrics = Metrics(namespace=namespace, service=service)
        self._model = model or "unknown"
        self._clock = clock
        self._last_at = clock()
        self._last_totals = Totals()
        self._last_engine: dict[str, float] = {}

    # --- events ------------------------------------------------------------------------------
    def chunk_done(
        self,
        *,
        completed: int,
        failed: int,
        input_tokens: int,
        output_tokens: int,
        careful: bool = False,
        reused: int = 0,
        crashed: int = 0,
    ) -> None:
        t = self.totals
        t.chunks_careful += careful
        t.lines_reused += reused
        t.lines_crashed += crashed
        t.chunks_done += 1
        t.lines_completed += completed
        t.lines_failed += failed
        t.input_tokens += input_tokens
        t.output_tokens += output_tokens

    def chunk_skipped(self) -> None:
        self.totals.chunks_skipped += 1

    def chunk_released(self) -> None:
        self.totals.chunks_released += 1

    def chunk_failed(self) -> None:
        self.totals.chunks_failed += 1

    def chunk_redelivered(self) -> None:
        self.totals.chunks_redelivered += 1

    # --- periodic flush ----------------------------------------------------------------------
    def flush(self, engine: EngineStats, *, in_flight: int, waiting: int, open_chunks: int, cap: int) -> dict[str, Any]:
        """Emit the interval's sums and gauges as EMF, log a summary line, return the summary."""
        now = self._clock()
        seconds = max(1e-9, now - self._last_at)
        delta = {f.name: getattr(self.totals, f.name) - getattr(self._last_totals, f.name) for f in fields(Totals)}
        engine_now = {name: float(getattr(engine, name)) for name in _ENGINE_COUNTERS}
        engine_errors = sum(n for status, n in engine.answered.items() if status >= 400 and status not in (429, 503))
        engine_now["error_answers"] = float(engine_errors)
        engine_delta = {k: v - self._last_engine.get(k, 0.0) for k, v in engine_now.items()}
        lines = delta["lines_completed"] + delta["lines_failed"]
        summary = {
            **delta,
            **{f"engine_{k}": int(v) for k, v in engine_delta.items()},
            "interval_seconds": round(seconds, 3),
            "lines_per_second": round(lines / seconds, 3),
            "output_tokens_per_second": round(delta["output_tokens"] / seconds, 3),
            "in_flight": in_flight,
            "waiting": waiting,
            "open_chunks": open_chunks,
            "in_flight_cap": cap,
        }
        m = self._metrics
        m.add_dimension(name="model", value=self._model)  # flushing clears dimensions
        for name, unit in (
            ("chunks_done", MetricUnit.Count),
            ("chunks_skipped", MetricUnit.Count),
            ("chunks_released", MetricUnit.Count),
            ("chunks_failed", MetricUnit.Count),
            ("chunks_redelivered", MetricUnit.Count),
            ("lines_completed", MetricUnit.Count),
            ("lines_failed", MetricUnit.Count),
            ("input_tokens", MetricUnit.Count),
            ("output_tokens", MetricUnit.Count),
            ("chunks_careful", MetricUnit.Count),
            ("lines_reused", MetricUnit.Count),
            ("lines_crashed", MetricUnit.Count),
        ):
            m.add_metric(name=_camel(name), unit=unit, value=delta[name])
        for name, value in engine_delta.items():
            m.add_metric(name=_camel(f"engine_{name}"), unit=MetricUnit.Count, value=value)
        m.add_metric(name="LinesPerSecond", unit=MetricUnit.CountPerSecond, value=summary["lines_per_second"])
        m.add_metric(
            name="OutputTokensPerSecond", unit=MetricUnit.CountPerSecond, value=summary["output_tokens_per_second"]
        )
        m.add_metric(name="InFlight", unit=MetricUnit.Count, value=in_flight)
        m.add_metric(name="OpenChunks", unit=MetricUnit.Count, value=open_chunks)
        m.flush_metrics()
        self.logger.info("worker stats", extra=summary)
        self._last_at, self._last_engine = now, engine_now
        self._last_totals = Totals(**{f.name: getattr(self.totals, f.name) for f in fields(Totals)})
        return summary


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def make_logger(service: str, level: str = "INFO") -> Logger:
    return Logger(service=service, level=level)
