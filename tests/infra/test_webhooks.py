"""Webhooks (docs/webhooks.md): an EventBridge rule sends the four terminal batch events to a
queue with a dead-letter queue after the 8 attempts of the schedule; one Lambda consumes it with
partial batch failures; least privilege (three table actions on the table only, its own queue)."""

import json

from .test_lambdas import _functions


def _queue(synth, construct) -> tuple[str, dict]:
    logical = synth.logical_id(construct)
    return logical, synth.resources("AWS::SQS::Queue")[logical]["Properties"]


def test_the_rule_routes_the_four_terminal_batch_events_to_the_queue(synth):
    queue, _ = _queue(synth, synth.stack.webhooks.queue)
    rule = synth.resources("AWS::Events::Rule")[synth.logical_id(synth.stack.webhooks.rule)]["Properties"]
    assert rule["EventPattern"] == {
        "source": ["batch-api"],
        "detail-type": ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"],
    }
    [target] = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [queue, "Arn"]}
    # the queue's policy lets EventBridge (and only it, for this rule) send
    policies = [p["Properties"] for p in synth.resources("AWS::SQS::QueuePolicy").values()
                if {"Ref": queue} in p["Properties"]["Queues"]]
    statements = [s for p in policies for s in p["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    rule_arn = {"Fn::GetAtt": [synth.logical_id(synth.stack.webhooks.rule), "Arn"]}
    assert [s["Principal"] for s in statements] == [{"Service": "events.amazonaws.com"}]
    assert "sqs:SendMessage" in statements[0]["Action"]
    assert statements[0]["Condition"] == {"ArnEquals": {"aws:SourceArn": rule_arn}}


def test_eight_attempts_then_the_dead_letter_queue_and_partial_batch_failures(synth):
    fn, props = _functions(synth)["webhooks"]
    queue, queue_props = _queue(synth, synth.stack.webhooks.queue)
    dlq, dlq_props = _queue(synth, synth.stack.webhooks.dead_letters)
    assert queue_props["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]}, "maxReceiveCount": 8}
    assert queue_props["VisibilityTimeout"] >= 6 * props["Timeout"]
    assert queue_props["MessageRetentionPeriod"] > 27 * 3600 + 35 * 60 + 5  # outlives the schedule
    assert dlq_props["MessageRetentionPeriod"] == 14 * 86_400
    (mapping,) = [m["Properties"] for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
                  if m["Properties"]["FunctionName"] == {"Ref": fn}]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [queue, "Arn"]}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert mapping["BatchSize"] * 10 < props["Timeout"]  # each POST waits at most 10 s
    env = props["Environment"]["Variables"]
    assert env["BATCHAPI_WEBHOOK_QUEUE_URL"] == {"Ref": queue}
    assert env["BATCHAPI_WEBHOOK_ALLOW_LOOPBACK_HTTP"] == "false"  # HTTPS only on AWS
    assert "VpcConfig" not in props


def test_least_privilege(synth):
    role = synth.logical_id(synth.stack.webhooks.function.role)
    granted = {(a, synth.render(json.loads(r))) for a, r in synth.permissions(role)}
    table = f"<{synth.logical_id(synth.stack.storage.table)}.Arn>"
    queue = f"<{synth.logical_id(synth.stack.webhooks.queue)}.Arn>"
    assert {(a, r) for a, r in granted if a.startswith("dynamodb:")} == {
        ("dynamodb:GetItem", table), ("dynamodb:Query", table), ("dynamodb:PutItem", table),
    }
    sqs = {(a, r) for a, r in granted if a.startswith("sqs:")}
    assert {r for _, r in sqs} == {queue}
    assert {"sqs:SendMessage", "sqs:ChangeMessageVisibility", "sqs:ReceiveMessage", "sqs:DeleteMessage"} <= {a for a, _ in sqs}
    assert not any(a.startswith(("s3:", "states:", "events:")) for a, _ in granted)
