"""The sweeper (docs/lifecycle.md, "Liveness: every batch ends"): a scheduled function over the
table's sparse open-batch index, with a dead-letter queue for the ticks it never received."""

import json

from functions.core import schema

from .test_lambdas import _functions


def test_the_table_has_the_sparse_keys_only_index_of_open_batches(synth):
    (_, table) = synth.one("AWS::DynamoDB::Table")
    indexes = {i["IndexName"]: i for i in table["Properties"]["GlobalSecondaryIndexes"]}
    index = indexes["open_batches"]
    assert index["KeySchema"] == [
        {"AttributeName": "open_pk", "KeyType": "HASH"},
        {"AttributeName": "open_sk", "KeyType": "RANGE"},
    ]
    # keys only: chunk counting, the table's busiest write, never writes to this index
    assert index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert (schema.GSI_OPEN, schema.GSI_OPEN_PK, schema.GSI_OPEN_SK) == ("open_batches", "open_pk", "open_sk")


def test_the_sweeper_runs_every_five_minutes_with_retries_and_a_dead_letter_queue(synth):
    fn, props = _functions(synth)["sweeper"]
    rules = [
        r["Properties"]
        for r in synth.resources("AWS::Events::Rule").values()
        if "ScheduleExpression" in r["Properties"]
        and any(t["Arn"] == {"Fn::GetAtt": [fn, "Arn"]} for t in r["Properties"]["Targets"])  # the scaler has its own
    ]
    (rule,) = rules
    assert rule["ScheduleExpression"] == "rate(5 minutes)"  # Settings.sweep_seconds' default, 300 s
    assert rule["State"] == "ENABLED"
    (target,) = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": [fn, "Arn"]}
    assert target["RetryPolicy"] == {"MaximumEventAgeInSeconds": 300, "MaximumRetryAttempts": 2}
    dlq = synth.logical_id(synth.stack.sweeper.dead_letters)
    assert target["DeadLetterConfig"] == {"Arn": {"Fn::GetAtt": [dlq, "Arn"]}}
    # EventBridge may invoke the sweeper (and only from this rule)
    permissions = [
        p["Properties"]
        for p in synth.resources("AWS::Lambda::Permission").values()
        if p["Properties"]["FunctionName"] == {"Fn::GetAtt": [fn, "Arn"]}
    ]
    (permission,) = permissions
    assert permission["Principal"] == "events.amazonaws.com" and permission["Action"] == "lambda:InvokeFunction"
    assert json.dumps(permission["SourceArn"]).count("Schedule") == 1
    env = props["Environment"]["Variables"]
    assert env["BATCHAPI_SWEEP_SECONDS"] == "300" and env["BATCHAPI_EXPIRY_GRACE_SECONDS"] == "900"
