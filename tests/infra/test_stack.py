"""Stack shape: name, outputs, no account/region baked in, monitoring."""

import json

from infra import names


def test_stack_name_and_outputs(synth):
    assert synth.stack.stack_name == names.STACK_NAME
    assert set(synth.json["Outputs"]) == {names.OUTPUT_API_URL, names.OUTPUT_TABLE, names.OUTPUT_BUCKET}
    assert synth.json["Outputs"][names.OUTPUT_TABLE]["Value"] == {"Ref": synth.one("AWS::DynamoDB::Table")[0]}
    assert synth.json["Outputs"][names.OUTPUT_BUCKET]["Value"] == {"Ref": synth.logical_id(synth.stack.storage.bucket)}


def test_environment_agnostic_without_config(synth):
    text = json.dumps(synth.json)
    assert "AWS::Region" in text and "AWS::AccountId" in text
    assert synth.stack.resolve(synth.stack.region).get("Ref") == "AWS::Region"


def test_alarms_cover_every_function_the_api_and_the_dead_letters(synth):
    alarms = list(synth.resources("AWS::CloudWatch::Alarm").values())
    by_metric = {}
    for alarm in alarms:
        by_metric.setdefault((alarm["Properties"]["Namespace"], alarm["Properties"]["MetricName"]), []).append(alarm)
    functions = synth.resources("AWS::Lambda::Function")
    lambda_alarms = by_metric[("AWS/Lambda", "Errors")]
    watched = {json.dumps(a["Properties"]["Dimensions"]) for a in lambda_alarms}
    assert len(lambda_alarms) == len(functions) == len(watched) == 3
    assert len(by_metric[("AWS/ApiGateway", "5XXError")]) == 1
    (dlq,) = by_metric[("AWS/SQS", "ApproximateNumberOfMessagesVisible")]
    assert dlq["Properties"]["Threshold"] == 1
    for alarm in alarms:
        assert alarm["Properties"]["TreatMissingData"] == "notBreaching"
        assert alarm["Properties"]["AlarmDescription"]
    synth.template.resource_count_is("AWS::CloudWatch::Dashboard", 1)
