"""The upload assembler (docs/uploads.md): a queue with a dead-letter queue feeding one Lambda,
one Upload per message, that may run 15 minutes; the API may send to it; least privilege."""

import json

from .test_lambdas import _functions


def _queue(synth, construct) -> tuple[str, dict]:
    logical = synth.logical_id(construct)
    return logical, synth.resources("AWS::SQS::Queue")[logical]["Properties"]


def test_the_assembler_is_fed_one_upload_at_a_time_with_retries_then_dead_letters(synth):
    fn, props = _functions(synth)["assembler"]
    assert props["Timeout"] == 900  # Lambda's maximum: 8 GB streamed at >= 10 MB/s
    assert props["MemorySize"] >= 1769  # one full vCPU for the md5
    queue, queue_props = _queue(synth, synth.stack.uploads.queue)
    dlq, _ = _queue(synth, synth.stack.uploads.dead_letters)
    # visibility at least six times the function's timeout (AWS's guidance for SQS event sources)
    assert queue_props["VisibilityTimeout"] >= 6 * 900
    assert queue_props["RedrivePolicy"] == {"deadLetterTargetArn": {"Fn::GetAtt": [dlq, "Arn"]}, "maxReceiveCount": 3}
    (mapping,) = [
        m["Properties"]
        for m in synth.resources("AWS::Lambda::EventSourceMapping").values()
        if m["Properties"]["FunctionName"] == {"Ref": fn}
    ]
    assert mapping["EventSourceArn"] == {"Fn::GetAtt": [queue, "Arn"]}
    assert mapping["BatchSize"] == 1 and mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    # every function reads the queue's URL from the one Settings
    for label in ("api", "assembler"):
        env = _functions(synth)[label][1]["Environment"]["Variables"]
        assert env["BATCHAPI_ASSEMBLY_QUEUE_URL"] == {"Ref": queue}


def _granted(synth, function) -> set[tuple[str, str]]:
    role = synth.logical_id(function.role)
    return {(action, synth.render(json.loads(resource))) for action, resource in synth.permissions(role)}


def test_the_api_may_hand_uploads_over_and_the_assembler_touches_only_uploads_and_files(synth):
    queue = synth.logical_id(synth.stack.uploads.queue)
    assert ("sqs:SendMessage", f"<{queue}.Arn>") in _granted(synth, synth.stack.api.api_function)
    granted = _granted(synth, synth.stack.uploads.function)
    bucket = f"<{synth.logical_id(synth.stack.storage.bucket)}.Arn>"
    s3 = {(action, resource) for action, resource in granted if action.startswith("s3:")}
    writes = {(a, r) for a, r in s3 if a.startswith(("s3:Put", "s3:Abort", "s3:Delete"))}
    assert {r for a, r in writes if a.startswith("s3:Delete")} == {f"{bucket}/uploads/*"}  # only parts/manifest
    assert {r for a, r in writes if not a.startswith("s3:Delete")} == {f"{bucket}/files/*/*"}  # only File bytes
    # grant_read also names the bucket itself (for its list actions); of the objects, only uploads/
    assert {r for a, r in s3 if a.startswith("s3:GetObject")} - {bucket} == {f"{bucket}/uploads/*"}
    assert not any(action.startswith("sqs:Send") for action, _ in granted)
