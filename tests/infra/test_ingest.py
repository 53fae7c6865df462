"""Ingest wiring: the S3 notification of input snapshots, the ingest and work queues (with their
DLQs, named and redriven as the local deployment does), and the event source mappings."""

import json

import pytest

from functions.core import schema
from infra import names
from infra.constructs import ingest

from .test_lambdas import _functions


def _queues(synth) -> dict[str, dict]:
    return {k: r["Properties"] for k, r in synth.resources("AWS::SQS::Queue").items()}


def _named_queues(synth) -> dict[str, tuple[str, dict]]:
    return {p["QueueName"]: (k, p) for k, p in _queues(synth).items() if "QueueName" in p}


def test_input_snapshots_notify_the_ingest_queue(synth):
    _, notifications = synth.one("Custom::S3BucketNotifications")
    props = notifications["Properties"]
    assert props["BucketName"] == {"Ref": synth.logical_id(synth.stack.storage.bucket)}
    (config,) = props["NotificationConfiguration"]["QueueConfigurations"]
    assert set(props["NotificationConfiguration"]) == {"QueueConfigurations"}
    assert config["QueueArn"] == {"Fn::GetAtt": [synth.logical_id(synth.stack.ingest.ingest_queue), "Arn"]}
    assert config["Events"] == ["s3:ObjectCreated:*"]
    rules = {r["Name"]: r["Value"] for r in config["Filter"]["Key"]["FilterRules"]}
    assert rules == {"prefix": schema.BATCHES_PREFIX, "suffix": schema.INPUT_NAME}


@pytest.mark.parametrize(
    ("key", "notified"),
    [
        (schema.batch_input_key("tenant-a", "batch_1"), True),
        (schema.batch_manifest_key("tenant-a", "batch_1"), False),
        (schema.chunk_part_key("tenant-a", "batch_1", 3, "a1b2c3", "out"), False),
        (schema.file_key("tenant-a", "file-1"), False),
        (schema.upload_part_key("tenant-a", "upload_1", "part_1"), False),
    ],
)
def test_notification_filter_matches_only_what_ingest_handles(key, notified):
    matches = key.startswith(ingest.SNAPSHOT_PREFIX) and key.endswith(ingest.SNAPSHOT_SUFFIX)
    assert matches == notified == (schema.parse_batch_input_key(key) is not None)


def test_s3_may_send_to_the_ingest_queue_from_this_bucket_only(synth):
    queue = synth.logical_id(synth.stack.ingest.ingest_queue)
    policies = [
        p["Properties"]
        for p in synth.resources("AWS::SQS::QueuePolicy").values()
        if {"Ref": queue} in p["Properties"]["Queues"]
    ]
    statements = [s for p in policies for s in p["PolicyDocument"]["Statement"]]
    (allow,) = [s for s in statements if s["Effect"] == "Allow"]
    assert allow["Principal"] == {"Service": "s3.amazonaws.com"}
    assert "sqs:SendMessage" in allow["Action"]
    assert allow["Condition"]["ArnLike"]["aws:SourceArn"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.storage.bucket), "Arn"]
    }


def test_every_queue_is_encrypted_and_tls_only(synth):
    queues = _queues(synth)
    # ingest + DLQ, work + DLQ per model, reaper DLQ, sweeper DLQ (undelivered schedule ticks),
    # scaler DLQ (undelivered scaler invocations), the upload assembler's queue + DLQ, the
    # webhook queue + DLQ, the audit queue + DLQ (governance on)
    assert len(queues) == 2 + 2 * len(synth.config.models) + 1 + 1 + 1 + 2 + 2 + 2
    denied = set()
    for policy in synth.resources("AWS::SQS::QueuePolicy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Effect"] == "Deny" and statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}:
                assert statement["Action"] == "sqs:*" and statement["Principal"] == {"AWS": "*"}
                denied |= {q["Ref"] for q in policy["Properties"]["Queues"]}
    for logical_id, props in queues.items():
        assert props["SqsManagedSseEnabled"] is True, logical_id
        assert logical_id in denied, logical_id


def test_ingest_queue_named_and_redriven_like_the_local_deployment(synth):
    named = _named_queues(synth)
    name = names.ingest_queue_name(names.STACK_NAME)
    assert name == "BatchApi-ingest"  # the stack is named BatchApi (docs/deploy.md)
    _, queue = named[name]
    dlq_id, dlq = named[names.dead_letter_queue_name(name)]
    assert queue["RedrivePolicy"] == {
        "deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]},
        "maxReceiveCount": names.INGEST_MAX_RECEIVES,
    }
    # A message must not reappear while its invocation still runs (AWS: >= 6 x the timeout).
    assert queue["VisibilityTimeout"] >= 6 * _functions(synth)["ingest"][1]["Timeout"]
    assert dlq["MessageRetentionPeriod"] == 14 * 86_400 and "RedrivePolicy" not in dlq


def test_one_work_queue_and_dlq_per_model(synth):
    named = _named_queues(synth)
    for model in synth.config.models:
        name = names.work_queue_name(names.STACK_NAME, model.name)
        queue_id, queue = named[name]
        dlq_id, _dlq = named[names.dead_letter_queue_name(name)]
        assert queue_id == synth.logical_id(synth.stack.ingest.work_queues[model.name])
        assert dlq_id == synth.logical_id(synth.stack.ingest.work_dead_letters[model.name])
        # docs/deploy.md and docs/worker.md: a chunk goes to the DLQ after 50 receives (the last
        # resort: the workers' own poison budget ends a poison chunk long before, and benign
        # releases must not dead-letter it); it stays invisible 120 s per receive
        # (WORKER_VISIBILITY_SECONDS' default, which the worker extends).
        assert queue["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq_id, "Arn"]}, "maxReceiveCount": 50}
        assert queue["VisibilityTimeout"] == 120
        # A batch may wait its whole completion window (24 h) for a GPU.
        assert queue["MessageRetentionPeriod"] >= 86_400
        assert len(name) <= 80 and len(names.dead_letter_queue_name(name)) <= 80  # SQS: names up to 80 characters
    assert set(named) >= {
        "BatchApi-work-org-Chat-Model-7B",
        "BatchApi-work-org-Chat-Model-7B-dlq",
        "BatchApi-work-embed-small",
        "BatchApi-work-embed-small-dlq",
    }


def _mappings(synth) -> dict[str, dict]:
    return {k: r["Properties"] for k, r in synth.resources("AWS::Lambda::EventSourceMapping").items()}


def test_ingest_lambda_consumes_the_ingest_queue_with_partial_batch_responses(synth):
    fn = _functions(synth)["ingest"][0]
    (props,) = [p for p in _mappings(synth).values() if p["FunctionName"] == {"Ref": fn}]
    assert props["EventSourceArn"] == {"Fn::GetAtt": [synth.logical_id(synth.stack.ingest.ingest_queue), "Arn"]}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert props["BatchSize"] == 1


def test_dlq_lambda_consumes_every_work_dlq_with_partial_batch_responses(synth):
    fn = _functions(synth)["dlq"][0]
    mappings = [p for p in _mappings(synth).values() if p["FunctionName"] == {"Ref": fn}]
    sources = {json.dumps(p["EventSourceArn"]) for p in mappings}
    assert sources == {
        json.dumps({"Fn::GetAtt": [synth.logical_id(q), "Arn"]}) for q in synth.stack.ingest.work_dead_letters.values()
    }
    assert all(p["FunctionResponseTypes"] == ["ReportBatchItemFailures"] for p in mappings)
    dlqs = _queues(synth)
    for q in synth.stack.ingest.work_dead_letters.values():
        assert dlqs[synth.logical_id(q)]["VisibilityTimeout"] >= 6 * _functions(synth)["dlq"][1]["Timeout"]


def test_nobody_consumes_the_work_queues_but_the_workers(synth):
    work = {json.dumps({"Fn::GetAtt": [synth.logical_id(q), "Arn"]}) for q in synth.stack.ingest.work_queues.values()}
    assert not [p for p in _mappings(synth).values() if json.dumps(p["EventSourceArn"]) in work]


def test_the_ingest_dlq_is_consumed_so_a_dead_lettered_batch_never_stays_validating(synth):
    """docs/lifecycle.md, "Liveness": the ingest DLQ's consumer fails, cancels or resumes the
    batch of every dead-lettered ingest event; its messages never reappear while it runs."""
    fn = _functions(synth)["ingest_dlq"][0]
    (props,) = [p for p in _mappings(synth).values() if p["FunctionName"] == {"Ref": fn}]
    dlq_id = synth.logical_id(synth.stack.ingest.ingest_dead_letters)
    assert props["EventSourceArn"] == {"Fn::GetAtt": [dlq_id, "Arn"]}
    assert props["FunctionResponseTypes"] == ["ReportBatchItemFailures"] and props["BatchSize"] == 1
    assert _queues(synth)[dlq_id]["VisibilityTimeout"] >= 6 * _functions(synth)["ingest_dlq"][1]["Timeout"]


def test_the_validating_deadline_lies_past_the_ingest_events_whole_retry_life(synth):
    """The sweeper fails a batch still validating after ``validating_timeout_seconds``: only once
    the ingest queue has given up on its event (every receive's visibility, and the last run)."""
    named = _named_queues(synth)
    _, queue = named[names.ingest_queue_name(names.STACK_NAME)]
    life = (
        queue["RedrivePolicy"]["maxReceiveCount"] * queue["VisibilityTimeout"]
        + _functions(synth)["ingest"][1]["Timeout"]
    )
    assert life == 5 * 3_600 + 600
    assert synth.stack.settings.validating_timeout_seconds > life
