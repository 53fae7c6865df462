"""Monitoring: one dashboard and the alarms, grown by ``watch_*`` calls as constructs are added.

The stack hands each construct's resources to a ``watch_*`` method; each adds a dashboard row and
its alarms. Alarms notify the config's SNS topic when there is one.

Batches by status come from the batch lifecycle events themselves: an EventBridge rule copies every
terminal event (source ``batch-api``) into a log group (an audit trail of finished batches), and a
metric filter counts them by ``detail.status``. The GPU workers' throughput comes from their EMF
metrics (gpu_worker/metrics.py: namespace and service from ``WorkerConfig``, dimension ``model``).
"""

from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from aws_cdk.interfaces import aws_events as events_refs
from constructs import Construct

from functions.core.lifecycle import event_type
from functions.core.names import EVENT_SOURCE, METRICS_NAMESPACE
from functions.core.wire import TERMINAL_STATUSES
from functions.webhooks.logic import DROPPED_METRIC as WEBHOOK_DROPS_METRIC
from infra.config import DeployConfig

from .common import log_group

PERIOD = cdk.Duration.minutes(5)
#: API Gateway 5XX answers in one period before the alarm fires (the authorizer and the api Lambda
#: answer errors themselves as 4xx/5xx with OpenAI's envelope; a few 5xx can be client-caused retries).
API_5XX_THRESHOLD = 5
#: Lambda errors (unhandled exceptions, timeouts) in one period before the alarm fires.
LAMBDA_ERRORS_THRESHOLD = 1
_WIDTH = 24  # dashboard grid width
MINUTE = cdk.Duration.minutes(1)
#: A work message waiting this long means the GPU service is not keeping up (or not running).
WORK_AGE_THRESHOLD = cdk.Duration.hours(3)
#: A dead-lettered chunk not handled within this long means the DLQ handler is failing.
DEAD_LETTER_AGE_THRESHOLD = cdk.Duration.minutes(15)
#: Custom metrics of the stack (batches by status).
NAMESPACE = METRICS_NAMESPACE
BATCHES_METRIC = "Batches"
#: The worker's EMF metric names (gpu_worker/metrics.py: Totals fields and engine counters in
#: CamelCase; tests/infra checks these against it).
WORKER_METRICS = {
    "lines_completed": "LinesCompleted",
    "lines_failed": "LinesFailed",
    "output_tokens": "OutputTokens",
    "input_tokens": "InputTokens",
    "chunks_done": "ChunksDone",
    "chunks_failed": "ChunksFailed",
    "chunks_redelivered": "ChunksRedelivered",
    "engine_error_answers": "EngineErrorAnswers",
    "engine_timeouts": "EngineTimeouts",
    "in_flight": "InFlight",
}


def batch_detail_types() -> list[str]:
    """The detail-types of the terminal batch events (``batch.<status>``, functions/core)."""
    return [event_type(status) for status in TERMINAL_STATUSES]


@jsii.implements(events.IRuleTarget)
class _LogGroupTarget:
    """A log group as an EventBridge target, with a native ``AWS::Logs::ResourcePolicy`` (CDK's own
    target installs that policy through a custom-resource Lambda)."""

    def __init__(self, group: logs.LogGroup) -> None:
        self.group = group

    def bind(self, rule: events_refs.IRuleRef, id: str | None = None) -> events.RuleTargetConfig:
        self.group.add_to_resource_policy(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                principals=[iam.ServicePrincipal("events.amazonaws.com")],
                resources=[self.group.log_group_arn],
                conditions={"ArnEquals": {"aws:SourceArn": rule.rule_ref.rule_arn}},
            )
        )
        arn = cdk.Stack.of(self.group).format_arn(
            service="logs",
            resource="log-group",
            resource_name=self.group.log_group_name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        return events.RuleTargetConfig(arn=arn, target_resource=self.group)


class Monitoring(Construct):
    def __init__(self, scope: Construct, id: str, *, config: DeployConfig) -> None:
        super().__init__(scope, id)
        self.config = config
        self.dashboard = cw.Dashboard(self, "Dashboard", default_interval=cdk.Duration.hours(3))
        self.alarms: list[cw.Alarm] = []
        self._topic = (
            sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarm_topic_arn) if config.alarm_topic_arn else None
        )

    # --- building blocks ----------------------------------------------------------------------
    def alarm(self, id: str, metric: cw.IMetric, *, threshold: float, description: str) -> cw.Alarm:
        """An alarm at ``metric >= threshold`` for one period; missing data is not breaching."""
        while self.node.try_find_child(id) is not None:  # two labels may map to one id
            id += "X"
        alarm = cw.Alarm(
            self,
            id,
            metric=metric,
            threshold=threshold,
            evaluation_periods=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            alarm_description=description,
        )
        if self._topic is not None:
            alarm.add_alarm_action(cw_actions.SnsAction(self._topic))
            alarm.add_ok_action(cw_actions.SnsAction(self._topic))
        self.alarms.append(alarm)
        return alarm

    def row(self, title: str, *widgets: cw.IWidget) -> None:
        self.dashboard.add_widgets(cw.TextWidget(markdown=f"## {title}", width=_WIDTH, height=1))
        self.dashboard.add_widgets(*widgets)

    @staticmethod
    def graph(title: str, *metrics: cw.IMetric, width: int = 8) -> cw.GraphWidget:
        return cw.GraphWidget(title=title, left=list(metrics), width=width, height=6)

    def queue_graphs(self, queue: sqs.IQueue, title: str, *, width: int = 8) -> tuple[cw.GraphWidget, cw.GraphWidget]:
        """A queue's depth (waiting, in flight) and the age of its oldest message, per minute."""
        return (
            self.graph(
                title,
                queue.metric_approximate_number_of_messages_visible(
                    period=MINUTE, statistic="Maximum", label="waiting"
                ),
                queue.metric_approximate_number_of_messages_not_visible(
                    period=MINUTE, statistic="Maximum", label="in flight"
                ),
                width=width,
            ),
            self.graph(
                "Oldest message (s)",
                queue.metric_approximate_age_of_oldest_message(period=MINUTE, statistic="Maximum"),
                width=width,
            ),
        )

    # --- what the stack watches ---------------------------------------------------------------
    def watch_rest_api(self, api: apigw.RestApi) -> None:
        self.row(
            "API",
            self.graph("Requests", api.metric_count(period=PERIOD, statistic="Sum")),
            self.graph(
                "Client and server errors",
                api.metric_client_error(period=PERIOD, statistic="Sum"),
                api.metric_server_error(period=PERIOD, statistic="Sum"),
            ),
            self.graph(
                "Latency (p50, p99)",
                api.metric_latency(period=PERIOD, statistic="p50"),
                api.metric_latency(period=PERIOD, statistic="p99"),
            ),
        )
        self.alarm(
            "Api5xx",
            api.metric_server_error(period=PERIOD, statistic="Sum"),
            threshold=API_5XX_THRESHOLD,
            description="The API answered 5xx (API Gateway or the api Lambda failing).",
        )

    def watch_functions(self, functions: dict[str, lambda_.IFunction]) -> None:
        """Lambda functions by label: errors, throttles, invocations, duration; an error alarm each."""
        self.row(
            "Lambda functions",
            self.graph(
                "Errors", *(f.metric_errors(period=PERIOD, statistic="Sum", label=n) for n, f in functions.items())
            ),
            self.graph(
                "Throttles",
                *(f.metric_throttles(period=PERIOD, statistic="Sum", label=n) for n, f in functions.items()),
            ),
            self.graph(
                "Invocations",
                *(f.metric_invocations(period=PERIOD, statistic="Sum", label=n) for n, f in functions.items()),
            ),
        )
        self.dashboard.add_widgets(
            self.graph(
                "Duration p99 (ms)",
                *(f.metric_duration(period=PERIOD, statistic="p99", label=n) for n, f in functions.items()),
                width=_WIDTH,
            )
        )
        for label, fn in functions.items():
            self.alarm(
                f"{_alarm_key(label)}Errors",
                fn.metric_errors(period=PERIOD, statistic="Sum"),
                threshold=LAMBDA_ERRORS_THRESHOLD,
                description=f"The {label} Lambda failed (unhandled error or timeout).",
            )

    def watch_dead_letter_queue(self, label: str, queue: sqs.IQueue) -> None:
        """A DLQ is healthy when empty: alarm on its first message."""
        visible = queue.metric_approximate_number_of_messages_visible(period=PERIOD, statistic="Maximum")
        self.row(f"Dead letters: {label}", self.graph("Messages", visible, width=_WIDTH))
        self.alarm(
            f"{_alarm_key(label)}DeadLetters",
            visible,
            threshold=1,
            description=f"Messages in the {label} dead-letter queue: work that failed every retry.",
        )

    def watch_webhook_drops(self) -> None:
        """Events the webhook fan-out dropped because the table does not bear them out (no such
        batch under that tenant, or not in that status: ``functions.webhooks.logic.verified_batch``).
        The stack's publishers never send one, so any is an alarm: someone forged an event."""
        dropped = cw.Metric(
            namespace=NAMESPACE,
            metric_name=WEBHOOK_DROPS_METRIC,
            dimensions_map={"service": "webhooks"},
            period=PERIOD,
            statistic="Sum",
        )
        self.row("Webhooks: dropped events", self.graph("Events", dropped, width=_WIDTH))
        self.alarm(
            "WebhookEventsDropped",
            dropped,
            threshold=1,
            description="The webhook fan-out dropped a batch event the table does not bear out (a batch that does "
            "not exist under that tenant or is not in that status): a forged event. The webhook Lambda's log line "
            "'webhook event dropped' names it; check who may put events on the batch event bus.",
        )

    def watch_queue(self, label: str, queue: sqs.IQueue) -> None:
        """A queue's depth (waiting, in flight) and the age of its oldest message."""
        self.row(f"Queue: {label}", *self.queue_graphs(queue, "Messages", width=12))

    def watch_batch_events(self, bus: events.IEventBus) -> logs.LogGroup:
        """Terminal batch events -> a log group (audit trail) -> batches by status."""
        group = log_group(self, "BatchEvents", self.config)
        rule = events.Rule(
            self,
            "BatchEventsRule",
            event_bus=bus,
            description="Terminal batch events (batch.completed/failed/expired/cancelled) into the batch events log",
            event_pattern=events.EventPattern(source=[EVENT_SOURCE], detail_type=batch_detail_types()),
        )
        rule.add_target(_LogGroupTarget(group))
        logs.MetricFilter(
            self,
            "BatchesByStatus",
            log_group=group,
            filter_pattern=logs.FilterPattern.exists("$.detail.status"),
            metric_namespace=NAMESPACE,
            metric_name=BATCHES_METRIC,
            metric_value="1",
            dimensions={"Status": "$.detail.status"},
        )
        self.row(
            "Batches",
            self.graph(
                "Finished batches by status",
                *(self.batches_metric(status) for status in TERMINAL_STATUSES),
                width=_WIDTH,
            ),
        )
        return group

    @staticmethod
    def batches_metric(status: str) -> cw.Metric:
        return cw.Metric(
            namespace=NAMESPACE,
            metric_name=BATCHES_METRIC,
            dimensions_map={"Status": status},
            period=PERIOD,
            statistic="Sum",
            label=status,
        )

    def watch_workflow(self, state_machine: sfn.StateMachine) -> None:
        """Workflow executions; an alarm when one fails (the batch landed in ``failed`` after
        validation, i.e. finalize could not finish it). Batches that failed validation are the
        client's error: they show under batches by status, they do not alarm."""
        failed = cw.MathExpression(
            expression="FILL(failed, 0) + FILL(timedOut, 0) + FILL(aborted, 0)",
            using_metrics={
                "failed": state_machine.metric_failed(period=PERIOD, statistic="Sum"),
                "timedOut": state_machine.metric_timed_out(period=PERIOD, statistic="Sum"),
                "aborted": state_machine.metric_aborted(period=PERIOD, statistic="Sum"),
            },
            period=PERIOD,
            label="failed, timed out or aborted",
        )
        self.row(
            "Workflow",
            self.graph(
                "Executions",
                state_machine.metric_started(period=PERIOD, statistic="Sum", label="started"),
                state_machine.metric_succeeded(period=PERIOD, statistic="Sum", label="succeeded"),
                failed,
                width=_WIDTH,
            ),
        )
        self.alarm(
            "FailedBatches",
            failed,
            threshold=1,
            description="A batch workflow failed: the batch ended 'failed' after it started running (finalize could "
            "not complete it). Its errors say why; the execution's history is in the state machine's logs.",
        )

    def watch_work_dead_letters(self, label: str, queue: sqs.IQueue) -> None:
        """A work queue's DLQ, drained by the DLQ Lambda: any dead-lettered chunk alarms (its lines
        were failed), and so does a chunk the handler has not drained."""
        received = queue.metric_number_of_messages_received(period=PERIOD, statistic="Sum")
        age = queue.metric_approximate_age_of_oldest_message(period=PERIOD, statistic="Maximum")
        key = _alarm_key(label)
        self.alarm(
            f"{key}DeadLetters",
            received,
            threshold=1,
            description=f"A chunk of {label} was dead-lettered (it failed on the GPU workers on every attempt); "
            "its lines were failed with server_error. Look at the worker logs for the batch.",
        )
        self.alarm(
            f"{key}DeadLettersStuck",
            age,
            threshold=DEAD_LETTER_AGE_THRESHOLD.to_seconds(),
            description=f"A dead-lettered chunk of {label} has waited {DEAD_LETTER_AGE_THRESHOLD.to_minutes()} minutes: "
            "the DLQ Lambda is failing, so its batch cannot finish.",
        )

    def watch_model(self, label: str, worker: Any, *, namespace: str, service: str) -> None:
        """A GPU service: queue depth and age, backlog per task, tasks and instances, lines/s,
        tokens/s, errors; alarms on the queue's age and on its dead letters. ``worker`` is a
        ``ModelWorker`` (its queue, service, backlog metrics; the scaler decides from the queue itself)."""
        queue: sqs.IQueue = worker.work_queue
        dims = {"service": service, "model": worker.model.name}

        def emf(key: str, statistic: str = "Sum") -> cw.Metric:
            return cw.Metric(
                namespace=namespace,
                metric_name=WORKER_METRICS[key],
                dimensions_map=dims,
                period=MINUTE,
                statistic=statistic,
                label=key.replace("_", " "),
            )

        per_second = {
            "lines/s": cw.MathExpression(
                expression="(FILL(done, 0) + FILL(failed, 0)) / PERIOD(done)",
                using_metrics={"done": emf("lines_completed"), "failed": emf("lines_failed")},
                period=MINUTE,
                label="lines/s",
            ),
            "output tokens/s": cw.MathExpression(
                expression="FILL(out, 0) / PERIOD(out)",
                using_metrics={"out": emf("output_tokens")},
                period=MINUTE,
                label="output tokens/s",
            ),
            "input tokens/s": cw.MathExpression(
                expression="FILL(inp, 0) / PERIOD(inp)",
                using_metrics={"inp": emf("input_tokens")},
                period=MINUTE,
                label="input tokens/s",
            ),
        }
        instances = [
            cw.Metric(
                namespace="AWS/AutoScaling",
                metric_name="GroupInServiceInstances",
                dimensions_map={"AutoScalingGroupName": group.auto_scaling_group_name},
                period=MINUTE,
                statistic="Maximum",
                label=f"{kind} instances",
            )
            for kind, group in worker.auto_scaling_groups.items()
        ]
        self.row(
            f"Model: {label}",
            *self.queue_graphs(queue, "Work queue (chunks)"),
            cw.GraphWidget(
                title="Backlog per task (the scaler adds a task at T)",
                left=[worker.backlog_per_task],
                left_annotations=[cw.HorizontalAnnotation(value=worker.model.backlog_per_task, label="scale out")],
                width=8,
                height=6,
            ),
            self.graph(
                "GPU tasks and instances",
                worker.task_count_metric("DesiredTaskCount").with_(label="desired tasks"),
                worker.task_count_metric("RunningTaskCount").with_(label="running tasks"),
                worker.task_count_metric("PendingTaskCount").with_(label="pending tasks"),
                *instances,
            ),
            self.graph("Lines/s", per_second["lines/s"]),
            self.graph("Tokens/s", per_second["output tokens/s"], per_second["input tokens/s"]),
        )
        self.dashboard.add_widgets(
            self.graph(
                "Worker errors",
                emf("lines_failed"),
                emf("chunks_failed"),
                emf("chunks_redelivered"),
                emf("engine_error_answers"),
                emf("engine_timeouts"),
                width=12,
            ),
            self.graph("Requests in flight (per task)", emf("in_flight", "Average"), width=12),
        )
        key = _alarm_key(label)
        self.alarm(
            f"{key}QueueAge",
            queue.metric_approximate_age_of_oldest_message(period=PERIOD, statistic="Maximum"),
            threshold=WORK_AGE_THRESHOLD.to_seconds(),
            description=f"A chunk for {label} has waited {WORK_AGE_THRESHOLD.to_hours()} hours: the GPU service is not "
            "keeping up (max_instances reached) or not running (no capacity, engine failing). Batches may expire.",
        )


def _alarm_key(label: str) -> str:
    """A construct id from a label (a model name may hold '/', '.', ...)."""
    return "".join(part.capitalize() for part in "".join(c if c.isalnum() else " " for c in label).split())
