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


def _statements(synth, role: str) -> list[dict]:
    return [st for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role} in p["Properties"]["Roles"]
            for st in p["Properties"]["PolicyDocument"]["Statement"]]


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


def test_the_table_rights_reach_webhook_records_only(synth):
    """``dynamodb:LeadingKeys`` (IAM's ``*`` as fnmatch's): the endpoint and attempt items of any
    tenant match; a tenant's files, batches, chunks, API keys and the scaler's state do not."""
    import fnmatch

    from functions.core import schema
    from functions.webhooks.store import AttemptRecord, EndpointRecord

    role = synth.logical_id(synth.stack.webhooks.function.role)
    [statement] = [st for st in _statements(synth, role) if any(a.startswith("dynamodb:") for a in st["Action"])]
    patterns = statement["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert patterns == ["T#*#WEBHOOKS"]

    def allowed(pk: str) -> bool:
        return any(fnmatch.fnmatchcase(pk, p) for p in patterns)

    for tenant in ("acme", "B", "WEBHOOKS", "x" * 64):
        endpoint = EndpointRecord(tenant=tenant, id="we_1", url="https://h", events=["batch.failed"],
                                  secret="whsec_AAAA", created_at=1, updated_at=1).to_item()
        attempt = AttemptRecord(tenant=tenant, endpoint_id="we_1", webhook_id="wh_1", event_id="evt_1",
                                event_type="batch.failed", attempt=1, at=1, outcome="delivered").to_item()
        assert allowed(endpoint[schema.PK]) and allowed(attempt[schema.PK])
        for other in (schema.tenant_pk(tenant), schema.batches_pk(tenant), schema.chunks_pk(tenant, "batch_1"),
                      schema.key_pk("abc"), schema.scaler_pk("m")):
            assert not allowed(other), other
