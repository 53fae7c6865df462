"""Lambda functions: the bundled code asset, runtime, environment from Settings, least privilege."""

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from functions.core.records import FileRecord
from infra.config import DeployConfig
from infra.constructs import lambdas
from infra.constructs.reaper import stream_filter

HANDLERS = {
    "api": "functions.api.handler.handler",
    "authorizer": "functions.authorizer.handler.handler",
    "reaper": "functions.reaper.handler.handler",
}


def _functions(synth) -> dict[str, tuple[str, dict]]:
    """label -> (logical id, properties) for each function, found by its handler."""
    by_handler = {r["Properties"]["Handler"]: (k, r["Properties"]) for k, r in synth.resources("AWS::Lambda::Function").items()}
    assert set(by_handler) == set(HANDLERS.values())
    return {label: by_handler[h] for label, h in HANDLERS.items()}


def _asset_dir(synth) -> Path:
    keys = {p["Code"]["S3Key"] for _, p in _functions(synth).values()}
    assert len(keys) == 1, "all functions share one code asset"
    (path,) = synth.outdir.glob("asset." + keys.pop().removesuffix(".zip"))
    return path


def test_runtime_and_architecture(synth):
    for _, props in _functions(synth).values():
        assert props["Runtime"] == lambdas.RUNTIME.name == "python3.12"
        assert props["Architectures"] == ["arm64"]
        assert props["TracingConfig"] == {"Mode": "Active"}
        assert "Ref" in props["LoggingConfig"]["LogGroup"]


def test_environment_is_exactly_settings_to_env(synth):
    table = {"Ref": synth.one("AWS::DynamoDB::Table")[0]}
    bucket = {"Ref": synth.logical_id(synth.stack.storage.bucket)}
    expected = DeployConfig().settings(table_name="<table>", bucket_name="<bucket>").to_env()
    expected = {k: {"<table>": table, "<bucket>": bucket}.get(v, v) for k, v in expected.items()}
    for label, (_, props) in _functions(synth).items():
        assert props["Environment"]["Variables"] == expected, label


def test_code_asset_is_functions_package_with_aarch64_dependencies(synth):
    asset = _asset_dir(synth)
    for handler in HANDLERS.values():
        module = handler.rsplit(".", 1)[0]
        assert (asset / (module.replace(".", "/") + ".py")).is_file(), handler
    assert (asset / "functions" / "core" / "schema.py").is_file()
    assert not list(asset.rglob("__pycache__")), "no bytecode from the build machine"
    # The compiled dependency was picked for the Lambda runtime, not for this machine.
    (core,) = (asset / "pydantic_core").glob("_pydantic_core.*.so")
    assert core.name.endswith("cpython-312-aarch64-linux-gnu.so")
    installed = {d.metadata["Name"].lower().replace("_", "-") for d in importlib.metadata.distributions(path=[str(asset)])}
    for requirement in lambdas.runtime_requirements():
        name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        assert name in installed, requirement
    assert not (asset / "moto").exists() and not (asset / "aws_cdk").exists(), "only run-time dependencies"


def test_reaper_reads_remove_events_of_file_items_only(synth):
    _, mapping = synth.one("AWS::Lambda::EventSourceMapping")
    props = mapping["Properties"]
    assert props["EventSourceArn"] == {"Fn::GetAtt": [synth.one("AWS::DynamoDB::Table")[0], "StreamArn"]}
    assert props["FunctionName"] == {"Ref": _functions(synth)["reaper"][0]}
    (flt,) = props["FilterCriteria"]["Filters"]
    assert json.loads(flt["Pattern"]) == {
        "eventName": ["REMOVE"],
        "dynamodb": {"OldImage": {"sk": {"S": [{"prefix": FileRecord.sort_key("")}]}}},
    }
    assert json.loads(flt["Pattern"]) == json.loads(json.dumps(synth.stack.resolve(stream_filter())))
    assert props["BisectBatchOnFunctionError"] is True
    assert props["DestinationConfig"]["OnFailure"]["Destination"] == {
        "Fn::GetAtt": [synth.logical_id(synth.stack.reaper.dead_letters), "Arn"]
    }


# --- IAM: each function can do what it needs and no more ---------------------------------------
def _permissions(synth, label: str) -> list[tuple[str, str]]:
    """(action, resource) pairs granted to the function's role, resources as JSON text."""
    fn_id, props = _functions(synth)[label]
    role_id = props["Role"]["Fn::GetAtt"][0]
    role = synth.json["Resources"][role_id]["Properties"]
    assert not role.get("ManagedPolicyArns"), "no AWS-managed policies on function roles"
    assert not role.get("Policies"), "no inline policies besides the generated default policy"
    pairs = []
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow"
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            pairs += [(a, json.dumps(r)) for a in actions for r in resources]
    return pairs


def _on(pairs, service: str) -> set[str]:
    return {a for a, _ in pairs if a.startswith(service + ":")}


def _ref(logical_id: str, attr: str = "Arn") -> str:
    return json.dumps({"Fn::GetAtt": [logical_id, attr]})


def _objects(logical_id: str) -> str:
    return json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [logical_id, "Arn"]}, "/*"]]})


@pytest.fixture(scope="module")
def ids(synth):
    return {
        "table": synth.one("AWS::DynamoDB::Table")[0],
        "bucket": synth.logical_id(synth.stack.storage.bucket),
    }


def _log_and_trace_only(pairs, log_group_id):
    assert _on(pairs, "logs") == {"logs:CreateLogStream", "logs:PutLogEvents"}
    assert {r for a, r in pairs if a.startswith("logs:")} == {_ref(log_group_id)}
    assert {r for a, r in pairs if a.startswith("xray:")} <= {'"*"'}


def test_api_lambda_reads_and_writes_table_and_bucket(synth, ids):
    pairs = _permissions(synth, "api")
    table_actions = {a for a, r in pairs if r == _ref(ids["table"])}
    assert {"dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
            "dynamodb:Query", "dynamodb:BatchGetItem", "dynamodb:ConditionCheckItem"} <= table_actions
    object_actions = {a for a, r in pairs if r == _objects(ids["bucket"])}
    assert {"s3:PutObject", "s3:GetObject*", "s3:DeleteObject*", "s3:Abort*"} <= object_actions
    assert "s3:List*" in {a for a, r in pairs if r == _ref(ids["bucket"])}
    # Nothing beyond its table, its bucket, its logs and tracing.
    assert _on(pairs, "dynamodb") == table_actions
    assert {r for a, r in pairs if a.startswith("s3:")} == {_objects(ids["bucket"]), _ref(ids["bucket"])}
    assert {a.split(":")[0] for a, _ in pairs} == {"dynamodb", "s3", "logs", "xray"}
    assert "s3:PutObjectAcl" not in object_actions


def test_authorizer_can_only_read_api_keys(synth, ids):
    pairs = _permissions(synth, "authorizer")
    assert [(a, r) for a, r in pairs if a.startswith("dynamodb:")] == [("dynamodb:GetItem", _ref(ids["table"]))]
    assert {a.split(":")[0] for a, _ in pairs} == {"dynamodb", "logs", "xray"}
    _log_and_trace_only(pairs, _functions(synth)["authorizer"][1]["LoggingConfig"]["LogGroup"]["Ref"])


def test_reaper_can_only_delete_objects(synth, ids):
    pairs = _permissions(synth, "reaper")
    assert {(a, r) for a, r in pairs if a.startswith("s3:")} == {("s3:DeleteObject*", _objects(ids["bucket"]))}
    stream = _ref(ids["table"], "StreamArn")
    dynamo = {(a, r) for a, r in pairs if a.startswith("dynamodb:")}
    assert dynamo == {
        ("dynamodb:DescribeStream", stream), ("dynamodb:GetRecords", stream), ("dynamodb:GetShardIterator", stream),
        ("dynamodb:ListStreams", '"*"'),  # no resource-level permissions for ListStreams
    }
    dlq = _ref(synth.logical_id(synth.stack.reaper.dead_letters))
    assert {r for a, r in pairs if a.startswith("sqs:")} == {dlq}
    assert "sqs:SendMessage" in _on(pairs, "sqs")
    assert {a.split(":")[0] for a, _ in pairs} == {"dynamodb", "s3", "sqs", "logs", "xray"}
    _log_and_trace_only(pairs, _functions(synth)["reaper"][1]["LoggingConfig"]["LogGroup"]["Ref"])
