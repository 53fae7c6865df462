"""Dashboard and alarms: every function, the API, every dead-letter queue, the work queues' age,
failed batches; batches by status from the lifecycle events; the workers' EMF metrics."""

import contextlib
import io
import json

from functions.core.wire import TERMINAL_STATUSES
from gpu_worker.config import WorkerConfig
from gpu_worker.engine_client import EngineStats
from gpu_worker.metrics import WorkerMetrics, make_logger

from .test_lambdas import HANDLERS, ours


def _alarms(synth) -> dict[str, dict]:
    """The Monitoring construct's alarms (the scaling alarms of the GPU services aside)."""
    return {
        k: r["Properties"] for k, r in synth.resources("AWS::CloudWatch::Alarm").items() if k.startswith("Monitoring")
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
    assert visible == {
        synth.logical_id(synth.stack.ingest.ingest_dead_letters),
        synth.logical_id(synth.stack.reaper.dead_letters),
        synth.logical_id(synth.stack.sweeper.dead_letters),  # schedule ticks that never reached the sweeper
        synth.logical_id(synth.stack.workers.scaler.dead_letters),  # scaler invocations never delivered
        synth.logical_id(synth.stack.audit.dead_letters),  # audit intents the appender gave up on
        synth.logical_id(synth.stack.uploads.dead_letters),  # uploads the assembler gave up on
        synth.logical_id(synth.stack.webhooks.dead_letters),  # webhook deliveries past their schedule
    }
    # The work DLQs are drained by the DLQ Lambda: a dead-lettered chunk alarms when received,
    # and again when it is not drained.
    received = {_queue_dimension(synth, p) for p in alarms if p["MetricName"] == "NumberOfMessagesReceived"}
    work_dlqs = {synth.logical_id(q) for q in synth.stack.ingest.work_dead_letters.values()}
    assert received == work_dlqs
    aged = {
        _queue_dimension(synth, p): p["Threshold"] for p in alarms if p["MetricName"] == "ApproximateAgeOfOldestMessage"
    }
    # docs/deploy.md: "a dead-lettered chunk ... the DLQ Lambda has not handled in 15 minutes"
    assert {q: aged[q] for q in work_dlqs} == {q: 15 * 60 for q in work_dlqs}
    assert all(p["Threshold"] == 1 for p in alarms if p["MetricName"] != "ApproximateAgeOfOldestMessage")


def test_work_queues_alarm_on_their_oldest_message(synth):
    alarms = [
        p for p in _alarms(synth).values() if "Namespace" in p and p["MetricName"] == "ApproximateAgeOfOldestMessage"
    ]
    by_queue = {_queue_dimension(synth, p): p["Threshold"] for p in alarms}
    for queue in synth.stack.ingest.work_queues.values():
        assert by_queue[synth.logical_id(queue)] == 3 * 3600  # docs/deploy.md: "oldest chunk waiting 3 hours"


def test_failed_batches_alarm_on_failed_workflows(synth):
    (props,) = [p for k, p in _alarms(synth).items() if k.startswith("MonitoringFailedBatches")]
    names = {m["MetricStat"]["Metric"]["MetricName"] for m in props["Metrics"] if "MetricStat" in m}
    assert names == {"ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted"}
    sm = synth.logical_id(synth.stack.workflow.state_machine)
    for m in props["Metrics"]:
        if "MetricStat" in m:
            assert m["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "StateMachineArn", "Value": {"Ref": sm}}]
    assert props["Threshold"] == 1


def _batch_events_rule(synth):
    """The one rule matching batch events (the schedules, the scaler's workflow-start rule and the
    webhooks' rule, tests/infra/test_webhooks.py, aside)."""
    webhooks = synth.logical_id(synth.stack.webhooks.rule)
    (found,) = [
        (k, r)
        for k, r in synth.resources("AWS::Events::Rule").items()
        if "EventPattern" in r["Properties"]
        and r["Properties"]["EventPattern"].get("source") != ["aws.states"]
        and k != webhooks
    ]
    return found


def test_terminal_batch_events_are_logged_and_counted_by_status(synth):
    rule_id, rule = _batch_events_rule(synth)
    props = rule["Properties"]
    assert props["EventBusName"] == {"Ref": synth.logical_id(synth.stack.events.bus)}  # the batch event bus
    assert props["EventPattern"] == {
        "source": ["batch-api"],
        "detail-type": [f"batch.{s}" for s in TERMINAL_STATUSES],
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
    assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": f"{rule_id}.Arn"}}
    assert sorted(statement["Action"]) == ["logs:CreateLogStream", "logs:PutLogEvents"]
    _, metric_filter = synth.one("AWS::Logs::MetricFilter")
    (transformation,) = metric_filter["Properties"]["MetricTransformations"]
    assert transformation == {
        "MetricNamespace": "BatchApi",
        "MetricName": "Batches",
        "MetricValue": "1",  # docs/deploy.md: "Batches" metric
        "Dimensions": [{"Key": "Status", "Value": "$.detail.status"}],
    }


def emitted_worker_metrics(config: WorkerConfig, model: str) -> dict[tuple[str, frozenset], set[str]]:
    """Run the worker's real metrics flush (gpu_worker/metrics.py) and read the EMF records it
    prints: (namespace, dimensions) -> metric names, exactly as CloudWatch will file them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        metrics = WorkerMetrics(
            namespace=config.metrics_namespace,
            service=config.service,
            logger=make_logger(config.service),
            model=model,
            clock=iter((0.0, 60.0)).__next__,
        )
        metrics.chunk_done(completed=3, failed=1, input_tokens=30, output_tokens=90)
        metrics.chunk_failed()
        metrics.chunk_redelivered()
        metrics.flush(
            EngineStats(requests=5, answered={200: 3, 400: 1}, retries=1, timeouts=1),
            in_flight=2,
            waiting=0,
            open_chunks=1,
            cap=8,
        )
    emitted: dict[tuple[str, frozenset], set[str]] = {}
    for text in out.getvalue().splitlines():
        record = json.loads(text)
        for directive in record.get("_aws", {}).get("CloudWatchMetrics", []):
            for dimension_set in directive["Dimensions"]:
                key = (directive["Namespace"], frozenset((d, record[d]) for d in dimension_set))
                emitted.setdefault(key, set()).update(m["Name"] for m in directive["Metrics"])
    assert emitted, "the flush emitted no EMF record"
    return emitted


def _worker_metrics_used(synth, namespaces: set[str]) -> list[tuple[str, str, frozenset]]:
    """(namespace, metric, dimensions) of every dashboard and alarm metric in a worker namespace."""
    used = []
    _, dashboard = synth.one("AWS::CloudWatch::Dashboard")
    body = json.loads(synth.render(dashboard["Properties"]["DashboardBody"]))
    for widget in body["widgets"]:
        for entry in widget.get("properties", {}).get("metrics", []):
            fields = [f for f in entry if not isinstance(f, dict)]
            if fields and fields[0] in namespaces:
                namespace, name, *dims = fields
                used.append((namespace, name, frozenset(zip(dims[::2], dims[1::2], strict=False))))
    for resource in synth.resources("AWS::CloudWatch::Alarm").values():
        props = resource["Properties"]
        stats = [props] + [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        for metric in stats:
            if metric.get("Namespace") in namespaces:
                dims = frozenset((d["Name"], synth.render(d["Value"])) for d in metric.get("Dimensions", []))
                used.append((metric["Namespace"], metric["MetricName"], dims))
    return used


def test_dashboard_and_alarms_use_exactly_the_metrics_the_worker_emits(synth):
    emitted: dict[tuple[str, frozenset], set[str]] = {}
    for model in synth.config.models:
        emitted.update(emitted_worker_metrics(model.worker_config(), model.name))
    used = _worker_metrics_used(synth, {namespace for namespace, _ in emitted})
    for model in synth.config.models:  # every model's service has its worker metrics shown
        assert any(("model", model.name) in dims for _, _, dims in used), model.name
    for namespace, name, dims in used:
        assert (namespace, dims) in emitted, f"{name}: no record with dimensions {sorted(dims)} in {namespace}"
        assert name in emitted[(namespace, dims)], f"the worker never emits {name}"


def test_dashboard_shows_queues_backlog_throughput_tasks_and_batches(synth):
    _, dashboard = synth.one("AWS::CloudWatch::Dashboard")
    body = synth.render(dashboard["Properties"]["DashboardBody"])
    defaults = WorkerConfig()
    for model in synth.config.models:
        assert f"Model: {model.name}" in body
    for needle in (
        f'"{defaults.metrics_namespace}","LinesCompleted","model","embed-small","service","{defaults.service}"',
        "OutputTokens",
        "PERIOD(out)",
        "DesiredTaskCount",
        "RunningTaskCount",
        "GroupInServiceInstances",
        "ApproximateAgeOfOldestMessage",
        "Backlog per task",
        '"BatchApi","Batches"',
        "ExecutionsStarted",
    ):
        assert needle in body, needle


def test_a_dropped_webhook_event_alarms(synth):
    """The webhook fan-out's count of events the table does not bear out (forged): any alarms."""
    from functions.webhooks.logic import DROPPED_METRIC

    [props] = [p for p in _alarms(synth).values() if p.get("MetricName") == DROPPED_METRIC]
    assert (props["Namespace"], props["Statistic"], props["Threshold"]) == ("BatchApi", "Sum", 1)
    assert props["Dimensions"] == [{"Name": "service", "Value": "webhooks"}]
    assert props["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
