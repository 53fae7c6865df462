"""Dashboard and alarms: every function, the API, every dead-letter queue, the work queues' age,
failed batches; batches by status from the lifecycle events; the workers' EMF metrics."""

import dataclasses
import json

from functions.core.models import TERMINAL_STATUSES
from functions.core.aws.eventbridge import EventBridge as Events
from gpu_worker import metrics as worker_metrics
from gpu_worker.config import WorkerConfig
from infra.constructs import monitoring

from .test_lambdas import HANDLERS, ours


def _alarms(synth) -> dict[str, dict]:
    """The Monitoring construct's alarms (the scaling alarms of the GPU services aside)."""
    return {
        k: r["Properties"] for k, r in synth.resources("AWS::CloudWatch::Alarm").items()
        if k.startswith("Monitoring")
    }


def _metric(props: dict) -> tuple[str, str]:
    return props["Namespace"], props["MetricName"]


def _queue_dimension(synth, props: dict) -> str:
    (dimension,) = props["Dimensions"]
    assert dimension["Name"] == "QueueName"
    return dimension["Value"]["Fn::GetAtt"][0]


def test_every_alarm_has_a_description_and_ignores_missing_data(synth):
    for props in _alarms(synth).values():
        assert props["TreatMissingData"] == "notBreaching"
        assert len(props["AlarmDescription"]) > 20


def test_every_function_has_an_error_alarm(synth):
    alarms = [p for p in _alarms(synth).values() if "Namespace" in p and _metric(p) == ("AWS/Lambda", "Errors")]
    watched = {p["Dimensions"][0]["Value"]["Ref"] for p in alarms}
    assert watched == set(ours(synth)) and len(watched) == len(HANDLERS)
    assert all(p["Threshold"] == 1 for p in alarms)


def test_api_5xx_alarm(synth):
    assert [p for p in _alarms(synth).values() if "Namespace" in p and _metric(p) == ("AWS/ApiGateway", "5XXError")]


def test_dead_letter_queues_alarm_on_their_first_message(synth):
    alarms = [p for p in _alarms(synth).values() if "Namespace" in p and p["Namespace"] == "AWS/SQS"]
    visible = {_queue_dimension(synth, p) for p in alarms if p["MetricName"] == "ApproximateNumberOfMessagesVisible"}
    # Nobody drains these two: a message in them alarms.
    assert visible == {synth.logical_id(synth.stack.ingest.ingest_dead_letters), synth.logical_id(synth.stack.reaper.dead_letters)}
    # The work DLQs are drained by the DLQ Lambda: a dead-lettered chunk alarms when received,
    # and again when it is not drained.
    received = {_queue_dimension(synth, p) for p in alarms if p["MetricName"] == "NumberOfMessagesReceived"}
    work_dlqs = {synth.logical_id(q) for q in synth.stack.ingest.work_dead_letters.values()}
    assert received == work_dlqs
    aged = {
        _queue_dimension(synth, p): p["Threshold"] for p in alarms if p["MetricName"] == "ApproximateAgeOfOldestMessage"
    }
    assert {q: aged[q] for q in work_dlqs} == {q: monitoring.DEAD_LETTER_AGE_THRESHOLD.to_seconds() for q in work_dlqs}
    assert all(p["Threshold"] == 1 for p in alarms if p["MetricName"] != "ApproximateAgeOfOldestMessage")


def test_work_queues_alarm_on_their_oldest_message(synth):
    alarms = [p for p in _alarms(synth).values() if "Namespace" in p and p["MetricName"] == "ApproximateAgeOfOldestMessage"]
    by_queue = {_queue_dimension(synth, p): p["Threshold"] for p in alarms}
    for queue in synth.stack.ingest.work_queues.values():
        assert by_queue[synth.logical_id(queue)] == monitoring.WORK_AGE_THRESHOLD.to_seconds()


def test_failed_batches_alarm_on_failed_workflows(synth):
    (props,) = [p for k, p in _alarms(synth).items() if k.startswith("MonitoringFailedBatches")]
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in props["Metrics"] if "MetricStat" in m}
    assert names == {"ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted"}
    sm = synth.logical_id(synth.stack.workflow.state_machine)
    for m in props["Metrics"]:
        if "MetricStat" in m:
            assert m["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "StateMachineArn", "Value": {"Ref": sm}}]
    assert props["Threshold"] == 1


def test_terminal_batch_events_are_logged_and_counted_by_status(synth):
    _, rule = synth.one("AWS::Events::Rule")
    props = rule["Properties"]
    assert props["EventBusName"] == "default"
    assert props["EventPattern"] == {
        "source": [Events.SOURCE], "detail-type": [f"batch.{s}" for s in TERMINAL_STATUSES],
    }
    (target,) = props["Targets"]
    group = synth.logical_id(synth.stack.monitoring.node.find_child("BatchEvents"))
    assert synth.render(target["Arn"]).endswith(f":log-group:<{group}>")
    assert "Input" not in target  # the whole event is logged
    # EventBridge may write to that log group only, and only for this rule.
    _, policy = synth.one("AWS::Logs::ResourcePolicy")
    document = json.loads(synth.render(policy["Properties"]["PolicyDocument"]).replace("<", "").replace(">", ""))
    (statement,) = document["Statement"]
    assert statement["Principal"] == {"Service": "events.amazonaws.com"}
    assert statement["Resource"] == f"{group}.Arn"
    assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": f"{synth.one('AWS::Events::Rule')[0]}.Arn"}}
    assert sorted(statement["Action"]) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    _, metric_filter = synth.one("AWS::Logs::MetricFilter")
    (transformation,) = metric_filter["Properties"]["MetricTransformations"]
    assert transformation == {
        "MetricNamespace": monitoring.NAMESPACE, "MetricName": monitoring.BATCHES_METRIC, "MetricValue": "1",
        "Dimensions": [{"Key": "Status", "Value": "$.detail.status"}],
    }


def test_worker_metric_names_are_the_ones_the_worker_emits():
    emitted = {worker_metrics._camel(f.name) for f in dataclasses.fields(worker_metrics.Totals)}
    emitted |= {worker_metrics._camel(f"engine_{name}") for name in (*worker_metrics._ENGINE_COUNTERS, "error_answers")}
    emitted |= {"InFlight", "OpenChunks", "LinesPerSecond", "OutputTokensPerSecond"}
    assert set(monitoring.WORKER_METRICS.values()) <= emitted
    for key, name in monitoring.WORKER_METRICS.items():
        assert name == worker_metrics._camel(key)


def test_dashboard_shows_queues_backlog_throughput_tasks_and_batches(synth):
    _, dashboard = synth.one("AWS::CloudWatch::Dashboard")
    body = synth.render(dashboard["Properties"]["DashboardBody"])
    defaults = WorkerConfig()
    for model in synth.config.models:
        assert f"Model: {model.name}" in body
    for needle in (
        f'"{defaults.metrics_namespace}","LinesCompleted","model","embed-small","service","{defaults.service}"',
        "OutputTokens", "PERIOD(out)", "DesiredTaskCount", "RunningTaskCount", "GroupInServiceInstances",
        "ApproximateAgeOfOldestMessage", "Backlog per task", f'"{monitoring.NAMESPACE}","{monitoring.BATCHES_METRIC}"',
        "ExecutionsStarted",
    ):
        assert needle in body, needle
