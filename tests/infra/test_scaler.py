"""The GPU scaler's deployment (infra/constructs/worker.py ``Scaler``): what it scales, when it
runs (the batch's workflow start, right after its chunks are enqueued, and every minute), and the
little it may do (read queue depth, read and set the services' desired counts, its own state items)."""

import fnmatch
import json

from functions.scaler.logic import ScaledService
from functions.scaler.settings import ScalerSettings

from .test_lambdas import _functions


def _scaler(synth) -> tuple[str, dict]:
    return _functions(synth)["scaler"]


def _rules_targeting(synth, function_id: str) -> dict[str, dict]:
    return {
        k: r["Properties"]
        for k, r in synth.resources("AWS::Events::Rule").items()
        if any(t["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]} for t in r["Properties"].get("Targets", []))
    }


def test_scaler_knows_every_models_service_queue_and_bounds(synth):
    _, props = _scaler(synth)
    env = {k: synth.render(v) for k, v in props["Environment"]["Variables"].items()}
    assert set(env) == {"SCALER_TABLE_NAME", "SCALER_SERVICES"}
    settings = ScalerSettings.from_env(env)  # what the Lambda will read, validated by its own class
    by_model = {s.model: s for s in settings.services}
    assert list(by_model) == [m.name for m in synth.config.models]
    for index, model in enumerate(synth.config.models):
        service = by_model[model.name]
        assert isinstance(service, ScaledService)
        queue = synth.logical_id(synth.stack.ingest.work_queues[model.name])
        assert service.queue_url == f"<{queue}>"
        assert service.cluster.startswith(f"<WorkersModel{index}Cluster")
        assert service.service.startswith(f"<WorkersModel{index}Service") and service.service.endswith(".Name>")
        assert (service.min_tasks, service.max_tasks, service.backlog_per_task) == (
            model.min_instances,
            model.max_instances,
            model.backlog_per_task,
        )
        assert service.idle_seconds == model.idle_minutes * 60
        assert service.scale_in_cooldown_seconds == 5 * 60
    assert settings.table_name == f"<{synth.one('AWS::DynamoDB::Table')[0]}>"


def test_scaler_runs_when_a_batch_starts_and_every_minute(synth):
    function_id, _ = _scaler(synth)
    rules = _rules_targeting(synth, function_id)
    schedules = [r for r in rules.values() if "ScheduleExpression" in r]
    events = [r for r in rules.values() if "EventPattern" in r]
    assert [r["ScheduleExpression"] for r in schedules] == ["rate(1 minute)"]
    (start,) = events
    sm = synth.logical_id(synth.stack.workflow.state_machine)
    assert start["EventPattern"] == {
        "source": ["aws.states"],
        "detail-type": ["Step Functions Execution Status Change"],
        "detail": {"status": ["RUNNING"], "stateMachineArn": [{"Ref": sm}]},
    }
    assert "EventBusName" not in start  # Step Functions sends these to the default bus
    dlq = synth.logical_id(synth.stack.workers.scaler.dead_letters)
    for rule in rules.values():
        (target,) = rule["Targets"]
        assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": [dlq, "Arn"]}
        assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] == 60


def _statements(synth, role_id: str) -> list[dict]:
    out = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            out += policy["Properties"]["PolicyDocument"]["Statement"]
    return out


def test_scaler_reads_queues_sets_its_services_and_touches_only_its_state_items(synth):
    _, props = _scaler(synth)
    role = props["Role"]["Fn::GetAtt"][0]
    pairs = {(a, synth.render(json.loads(r))) for a, r in synth.permissions(role)}
    queues = {f"<{synth.logical_id(q)}.Arn>" for q in synth.stack.ingest.work_queues.values()}
    assert {(a, r) for a, r in pairs if a.startswith("sqs:")} == {("sqs:GetQueueAttributes", q) for q in queues}
    services = {f"<{synth.logical_id(w.service)}>" for w in synth.stack.workers.workers.values()}
    assert {(a, r) for a, r in pairs if a.startswith("ecs:")} == {
        (a, s) for a in ("ecs:DescribeServices", "ecs:UpdateService") for s in services
    }
    assert {a.split(":")[0] for a, _ in pairs} == {"sqs", "ecs", "dynamodb", "logs", "xray"}
    (table,) = [s for s in _statements(synth, role) if any(a.startswith("dynamodb:") for a in s["Action"])]
    assert sorted(table["Action"]) == ["dynamodb:GetItem", "dynamodb:PutItem"]
    patterns = table["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert [
        p for p in ("SCALER#embed-small", "T#acme", "KEY#abc") if any(fnmatch.fnmatchcase(p, x) for x in patterns)
    ] == ["SCALER#embed-small"]
