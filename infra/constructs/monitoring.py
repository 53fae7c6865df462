"""Monitoring: one dashboard and the alarms, grown by ``watch_*`` calls as constructs are added.

The stack hands each construct's resources to a ``watch_*`` method; each adds a dashboard row and
its alarms. Later constructs add their own methods here (queues, workflow, GPU services) in the
same shape. Alarms notify the config's SNS topic when there is one.
"""

import aws_cdk as cdk
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import DeployConfig

PERIOD = cdk.Duration.minutes(5)
#: API Gateway 5XX answers in one period before the alarm fires (the authorizer and the api Lambda
#: answer errors themselves as 4xx/5xx with OpenAI's envelope; a few 5xx can be client-caused retries).
API_5XX_THRESHOLD = 5
#: Lambda errors (unhandled exceptions, timeouts) in one period before the alarm fires.
LAMBDA_ERRORS_THRESHOLD = 1
_WIDTH = 24  # dashboard grid width


class Monitoring(Construct):
    def __init__(self, scope: Construct, id: str, *, config: DeployConfig) -> None:
        super().__init__(scope, id)
        self.dashboard = cw.Dashboard(self, "Dashboard", default_interval=cdk.Duration.hours(3))
        self.alarms: list[cw.Alarm] = []
        self._topic = (
            sns.Topic.from_topic_arn(self, "AlarmTopic", config.alarm_topic_arn) if config.alarm_topic_arn else None
        )

    # --- building blocks ----------------------------------------------------------------------
    def alarm(self, id: str, metric: cw.IMetric, *, threshold: float, description: str) -> cw.Alarm:
        """An alarm at ``metric >= threshold`` for one period; missing data is not breaching."""
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
            self.graph("Errors", *(f.metric_errors(period=PERIOD, statistic="Sum", label=n) for n, f in functions.items())),
            self.graph("Throttles", *(f.metric_throttles(period=PERIOD, statistic="Sum", label=n) for n, f in functions.items())),
            self.graph("Invocations", *(f.metric_invocations(period=PERIOD, statistic="Sum", label=n) for n, f in functions.items())),
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
                f"{label.title().replace('-', '')}Errors",
                fn.metric_errors(period=PERIOD, statistic="Sum"),
                threshold=LAMBDA_ERRORS_THRESHOLD,
                description=f"The {label} Lambda failed (unhandled error or timeout).",
            )

    def watch_dead_letter_queue(self, label: str, queue: sqs.IQueue) -> None:
        """A DLQ is healthy when empty: alarm on its first message."""
        visible = queue.metric_approximate_number_of_messages_visible(period=PERIOD, statistic="Maximum")
        self.row(f"Dead letters: {label}", self.graph("Messages", visible, width=_WIDTH))
        self.alarm(
            f"{label.title().replace('-', '')}DeadLetters",
            visible,
            threshold=1,
            description=f"Messages in the {label} dead-letter queue: work that failed every retry.",
        )
