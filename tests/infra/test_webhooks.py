"""Webhooks (docs/webhooks.md): an EventBridge rule on the batch event bus sends the four terminal
batch events to a queue whose dead-letter queue takes the spent schedules (sent by the Lambda) and
the messages that could not be handled; one Lambda consumes it with partial batch failures, its
attempts of one round at once within its timeout; least privilege (the webhook partitions, one
read of the batch partitions, its own queues)."""

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
    policies = [
        p["Properties"]
        for p in synth.resources("AWS::SQS::QueuePolicy").values()
        if {"Ref": queue} in p["Properties"]["Queues"]
    ]
    statements = [s for p in policies for s in p["PolicyDocument"]["Statement"] if s["Effect"] == "Allow"]
    rule_arn = {"Fn::GetAtt": [synth.logical_id(synth.stack.webhooks.rule), "Arn"]}
    assert [s["Principal"] for s in statements] == [{"Service": "events.amazonaws.com"}]
    assert "sqs:SendMessage" in statements[0]["Action"]
    assert statements[0]["Condition"] == {"ArnEquals": {"aws:SourceArn": rule_arn}}


def test_a_dead_letter_queue_for_poison_and_partial_batch_failures(synth):
    from functions.webhooks import logic

    fn, props = _functions(synth)["webhooks"]
    queue, queue_props = _queue(synth, synth.stack.webhooks.queue)
    dlq, dlq_props = _queue(synth, synth.stack.webhooks.dead_letters)
    # each attempt is a message of its own, received once or twice: the redrive counts handling failures
    assert queue_props["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]}, "maxReceiveCount": 20}
    assert queue_props["RedrivePolicy"]["maxReceiveCount"] > 2
    assert queue_props["VisibilityTimeout"] >= 6 * props["Timeout"]
    assert queue_props["MessageRetentionPeriod"] > 27 * 3600 + 35 * 60 + 5  # outlives the schedule
    assert dlq_props["MessageRetentionPeriod"] == 14 * 86_400
    (mapping,) = [
        m["Properties"]
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": fn}
    ]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [queue, "Arn"]}
    assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    # a round's attempts run at once, each within the deadline: one starts only with this much left
    assert mapping["BatchSize"] == logic.BATCH_SIZE == 10
    assert logic.POST_DEADLINE_SECONDS < logic.ATTEMPT_RESERVE_SECONDS < props["Timeout"]
    env = props["Environment"]["Variables"]
    assert env["BATCHAPI_WEBHOOK_QUEUE_URL"] == {"Ref": queue}
    assert env["BATCHAPI_WEBHOOK_DEAD_LETTER_QUEUE_URL"] == {"Ref": dlq}
    assert env["BATCHAPI_WEBHOOK_ALLOW_LOOPBACK_HTTP"] == "false"  # HTTPS only on AWS
    assert "VpcConfig" not in props


def _statements(synth, role: str) -> list[dict]:
    return [
        st
        for p in synth.resources("AWS::IAM::Policy").values()
        if {"Ref": role} in p["Properties"]["Roles"]
        for st in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def test_least_privilege(synth):
    role = synth.logical_id(synth.stack.webhooks.function.role)
    granted = {(a, synth.render(json.loads(r))) for a, r in synth.permissions(role)}
    table = f"<{synth.logical_id(synth.stack.storage.table)}.Arn>"
    queue = f"<{synth.logical_id(synth.stack.webhooks.queue)}.Arn>"
    dlq = f"<{synth.logical_id(synth.stack.webhooks.dead_letters)}.Arn>"
    assert {(a, r) for a, r in granted if a.startswith("dynamodb:")} == {
        ("dynamodb:GetItem", table),
        ("dynamodb:Query", table),
        ("dynamodb:PutItem", table),
    }
    sqs = {(a, r) for a, r in granted if a.startswith("sqs:")}
    assert {r for _, r in sqs} == {queue, dlq}
    assert {"sqs:SendMessage", "sqs:ChangeMessageVisibility", "sqs:ReceiveMessage", "sqs:DeleteMessage"} <= {
        a for a, r in sqs if r == queue
    }
    assert {a for a, r in sqs if r == dlq} == {"sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}
    assert not any(a.startswith(("s3:", "states:", "events:")) for a, _ in granted)


def _table_statements(synth) -> dict[tuple[str, ...], list[str]]:
    """The webhook role's table statements: actions -> their ``dynamodb:LeadingKeys`` patterns."""
    role = synth.logical_id(synth.stack.webhooks.function.role)
    found = {}
    for st in _statements(synth, role):
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if any(a.startswith("dynamodb:") for a in actions):
            assert set(st["Condition"]) == {"ForAllValues:StringLike"}
            found[tuple(sorted(actions))] = st["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    return found


def test_the_table_rights_reach_webhook_records_and_read_batches_only(synth):
    """``dynamodb:LeadingKeys`` (IAM's ``*`` as fnmatch's): the endpoint and attempt items of any
    tenant match the write rights; the batch items match one GetItem (the fan-out's read of the
    batch); a tenant's files, chunks, API keys, policies, budgets and the scaler's state match none."""
    import fnmatch

    from functions.core import schema
    from functions.webhooks.store import AttemptRecord, EndpointRecord
    from tests.builders import batch_record

    statements = _table_statements(synth)
    assert statements == {
        ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query"): ["T#*#WEBHOOKS"],
        ("dynamodb:GetItem",): ["T#*#BATCHES"],
    }
    patterns = statements[("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:Query")]

    def allowed(pk: str, patterns: list[str] = patterns) -> bool:
        return any(fnmatch.fnmatchcase(pk, p) for p in patterns)

    def readable(pk: str) -> bool:
        return allowed(pk, statements[("dynamodb:GetItem",)])

    for tenant in ("acme", "B", "x" * 64):
        batch = batch_record(tenant=tenant, input_key="k")
        assert readable(batch.keys()[schema.PK])
        for other in (
            schema.tenant_pk(tenant),
            schema.chunks_pk(tenant, "batch_1"),
            schema.key_pk("abc"),
            schema.scaler_pk("m"),
            schema.enqueued_pk(tenant),
            schema.budget_pk(tenant),
            schema.creations_pk(tenant),
            schema.audit_pk(tenant),
            schema.TENANTS_PK,
        ):
            assert not readable(other) and not allowed(other), other

    for tenant in ("acme", "B", "WEBHOOKS", "x" * 64):
        endpoint = EndpointRecord(
            tenant=tenant,
            id="we_1",
            url="https://h",
            events=["batch.failed"],
            secret="whsec_AAAA",
            created_at=1,
            updated_at=1,
        ).to_item()
        attempt = AttemptRecord(
            tenant=tenant,
            endpoint_id="we_1",
            webhook_id="wh_1",
            event_id="evt_1",
            event_type="batch.failed",
            attempt=1,
            at=1,
            outcome="delivered",
        ).to_item()
        assert allowed(endpoint[schema.PK]) and allowed(attempt[schema.PK])
        for other in (
            schema.tenant_pk(tenant),
            schema.batches_pk(tenant),
            schema.chunks_pk(tenant, "batch_1"),
            schema.key_pk("abc"),
            schema.scaler_pk("m"),
        ):
            assert not allowed(other), other
