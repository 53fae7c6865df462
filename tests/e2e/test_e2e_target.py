"""The e2e suite's target plumbing (tests/e2e/target.py, conftest.py): choosing local or AWS,
reading a stack's outputs (a stubbed CloudFormation client with DescribeStacks' real response
shape, and moto's CloudFormation), keys made with batchctl's code and revoked at the end, the
``local_only`` tests being exactly those that need local state, and the AWS mode starting nothing
local. The last test rehearses ``make e2e-aws`` against a local deployment dressed as a stack."""

import datetime
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from batchctl import cli as batchctl_cli
from batchctl import targets as batchctl_targets
from functions.core import auth, schema
from functions.core.errors import AuthenticationFailed
from infra import names
from infra.local import state as local_state

from . import target as e2e_target
from .conftest import REPO, clean_env

STACK_ID = "arn:aws:cloudformation:eu-west-1:123456789012:stack/BatchApi/1c2fa620-c1d7-11ef-9cf4-0a1b2c3d4e5f"
API_URL = "https://a1b2c3d4e5.execute-api.eu-west-1.amazonaws.com/prod/v1"
TABLE = "BatchApi-StorageTable1A2B3C4D-1QWERTYUIOP"
BUCKET = "batchapi-storagebucket5e6f7a8b-abcdefghijkl"


def describe_stacks_response(outputs: dict[str, str]) -> dict:
    """DescribeStacks as CloudFormation answers it for a deployed stack (the shape botocore's
    service model checks)."""
    return {
        "Stacks": [
            {
                "StackId": STACK_ID,
                "StackName": names.STACK_NAME,
                "CreationTime": datetime.datetime(2026, 11, 30, 9, 0, tzinfo=datetime.UTC),
                "LastUpdatedTime": datetime.datetime(2026, 11, 30, 9, 30, tzinfo=datetime.UTC),
                "StackStatus": "UPDATE_COMPLETE",
                "DisableRollback": False,
                "NotificationARNs": [],
                "Capabilities": ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"],
                "Outputs": [
                    {
                        "OutputKey": key,
                        "OutputValue": value,
                        **({"Description": "base_url for the openai SDK"} if key == "ApiUrl" else {}),
                    }
                    for key, value in outputs.items()
                ],
                "Tags": [],
                "EnableTerminationProtection": False,
                "DriftInformation": {"StackDriftStatus": "NOT_CHECKED"},
            }
        ],
    }


ALL_OUTPUTS = {"ApiUrl": API_URL, "TableName": TABLE, "BucketName": BUCKET}


def stubbed_cloudformation(*responses: dict | Exception) -> tuple[object, Stubber]:
    client = boto3.client("cloudformation", region_name="eu-west-1")
    stubber = Stubber(client)
    for response in responses:
        if isinstance(response, Exception):
            stubber.add_client_error(
                "describe_stacks",
                service_error_code="ValidationError",
                service_message=str(response),
                http_status_code=400,
                expected_params={"StackName": names.STACK_NAME},
            )
        else:
            stubber.add_response("describe_stacks", response, expected_params={"StackName": names.STACK_NAME})
    stubber.activate()
    return client, stubber


# --- Settings ------------------------------------------------------------------------------------
def test_the_default_target_is_local() -> None:
    settings = e2e_target.E2ESettings.from_env({})
    assert (settings.kind, settings.stack, settings.chat_model, settings.embed_model) == (
        "local",
        "BatchApi",
        None,
        None,
    )
    assert settings.key_cache_seconds == 300  # infra/config.py's default authorizer cache
    assert settings.warm_up_seconds == 30 * 60  # GPU services from zero: 10-20 minutes is normal


def test_aws_target_takes_batchctls_stack_variable_and_the_models() -> None:
    settings = e2e_target.E2ESettings.from_env(
        {
            "BATCHAPI_E2E_TARGET": "aws",
            "BATCHAPI_STACK": "Staging",
            "BATCHAPI_E2E_CHAT_MODEL": "Qwen/Qwen2.5-7B-Instruct",
            "BATCHAPI_E2E_KEY_CACHE_SECONDS": "0",
        }
    )
    assert (settings.kind, settings.stack, settings.chat_model, settings.key_cache_seconds) == (
        "aws",
        "Staging",
        "Qwen/Qwen2.5-7B-Instruct",
        0,
    )


@pytest.mark.parametrize(
    "env",
    [
        {"BATCHAPI_E2E_TARGET": "AWS"},
        {"BATCHAPI_E2E_TARGET": "prod"},
        {"BATCHAPI_E2E_KEY_CACHE_SECONDS": "5m"},
        {"BATCHAPI_E2E_WARM_UP_SECONDS": "-1"},
    ],
)
def test_a_bad_setting_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=next(iter(env))):
        e2e_target.E2ESettings.from_env(env)


# --- Models from the target ----------------------------------------------------------------------
def test_models_come_from_what_the_target_serves() -> None:
    local = ["all-minilm-l6-v2", "smollm2-135m-instruct"]
    assert (
        e2e_target.pick_model(local, wanted=None, local="smollm2-135m-instruct", only_if_alone=True)
        == "smollm2-135m-instruct"
    )
    assert e2e_target.pick_model(local, wanted=None, local="all-minilm-l6-v2") == "all-minilm-l6-v2"
    # The default stack serves one chat model: the chat tests use it, the embeddings tests have none.
    stack = ["Qwen/Qwen2.5-7B-Instruct"]
    assert (
        e2e_target.pick_model(stack, wanted=None, local="smollm2-135m-instruct", only_if_alone=True)
        == "Qwen/Qwen2.5-7B-Instruct"
    )
    assert e2e_target.pick_model(stack, wanted=None, local="all-minilm-l6-v2") is None
    # Two served and none named: no guessing which one chats.
    two = ["Qwen/Qwen2.5-7B-Instruct", "bge-m3"]
    assert e2e_target.pick_model(two, wanted=None, local="smollm2-135m-instruct", only_if_alone=True) is None
    assert (
        e2e_target.pick_model(two, wanted=None, local="x", exclude="bge-m3", only_if_alone=True)
        == "Qwen/Qwen2.5-7B-Instruct"
    )
    assert e2e_target.pick_model(two, wanted="bge-m3", local="all-minilm-l6-v2") == "bge-m3"
    with pytest.raises(ValueError, match="not served"):
        e2e_target.pick_model(two, wanted="gpt-4o", local="x")


# --- The stack's outputs -------------------------------------------------------------------------
def test_the_stack_is_read_with_one_describe_stacks(tmp_path: Path) -> None:
    cloudformation, stubber = stubbed_cloudformation(describe_stacks_response(ALL_OUTPUTS))
    repos = []
    stack = e2e_target.open_stack(
        e2e_target.E2ESettings(kind="aws"),
        cloudformation=cloudformation,
        operator_env={"AWS_REGION": "eu-west-1"},
        state_dir=tmp_path,
        region="eu-west-1",
        key_repo=lambda target: repos.append(target) or "the key repo",
    )
    stubber.assert_no_pending_responses()
    assert (stack.base_url, stack.bucket, stack.kind) == (API_URL, BUCKET, "aws")
    # AWS itself (no endpoint), in the operator's region
    assert [(t.kind, t.table_name, t.endpoint_url, t.region) for t in repos] == [("aws", TABLE, None, "eu-west-1")]
    assert stack.keys == "the key repo"


@pytest.mark.parametrize("missing", ["ApiUrl", "TableName", "BucketName"])
def test_a_stack_without_an_output_is_a_clear_error(missing: str, tmp_path: Path) -> None:
    outputs = {k: v for k, v in ALL_OUTPUTS.items() if k != missing}
    cloudformation, _ = stubbed_cloudformation(describe_stacks_response(outputs))
    with pytest.raises(batchctl_targets.TargetError, match=f"no '{missing}' output"):
        e2e_target.open_stack(
            e2e_target.E2ESettings(kind="aws"),
            cloudformation=cloudformation,
            operator_env={},
            state_dir=tmp_path,
            key_repo=lambda target: None,
        )


def test_a_missing_stack_is_a_clear_error(tmp_path: Path) -> None:
    cloudformation, _ = stubbed_cloudformation(Exception("Stack with id BatchApi does not exist"))
    with pytest.raises(
        batchctl_targets.TargetError, match="cannot read stack 'BatchApi': Stack with id BatchApi does not exist"
    ):
        e2e_target.open_stack(
            e2e_target.E2ESettings(kind="aws"),
            cloudformation=cloudformation,
            operator_env={},
            state_dir=tmp_path,
            key_repo=lambda target: None,
        )


@mock_aws
def test_batchctl_and_the_suite_use_aws_region(tmp_path: Path) -> None:
    """AWS_REGION (what the AWS CLI v2 and docs/deploy.md use; boto3 alone reads only
    AWS_DEFAULT_REGION) picks the stack's region: a stack and table that exist only in eu-west-3
    are found while AWS_DEFAULT_REGION says us-east-1."""
    region = "eu-west-3"
    boto3.client("dynamodb", region_name=region).create_table(TableName=TABLE, **schema.TABLE_SCHEMA)
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {k: {"Value": v} for k, v in ALL_OUTPUTS.items()},
    }
    boto3.client("cloudformation", region_name=region).create_stack(
        StackName=names.STACK_NAME, TemplateBody=json.dumps(template)
    )
    env = {"AWS_REGION": region, "AWS_DEFAULT_REGION": "us-east-1", local_state.STATE_DIR_ENV: str(tmp_path)}

    assert (
        batchctl_targets.aws_region(env) == region and batchctl_targets.aws_region({"AWS_DEFAULT_REGION": "x"}) is None
    )
    out, err = io.StringIO(), io.StringIO()
    assert batchctl_cli.main(["--aws", "keys", "create", "--tenant", "acme"], env=env, out=out, err=err) == 0, (
        err.getvalue()
    )
    key = out.getvalue().strip()
    stack = e2e_target.open_stack(
        e2e_target.E2ESettings(kind="aws"),
        cloudformation=batchctl_targets.cloudformation(batchctl_targets.aws_region(env)),
        operator_env=env,
        state_dir=tmp_path,
        region=batchctl_targets.aws_region(env),
    )
    assert auth.resolve_tenant(stack.keys, f"Bearer {key}") == "acme"  # the suite reads the table batchctl wrote


def test_redirects_are_recognised_as_the_stacks_bucket(tmp_path: Path) -> None:
    cloudformation, _ = stubbed_cloudformation(describe_stacks_response(ALL_OUTPUTS))
    stack = e2e_target.open_stack(
        e2e_target.E2ESettings(kind="aws"),
        cloudformation=cloudformation,
        operator_env={},
        state_dir=tmp_path,
        key_repo=lambda target: None,
    )
    signed = "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=abc"
    assert stack.is_storage_url(urlsplit(f"https://{BUCKET}.s3.eu-west-1.amazonaws.com/files/t/file-1{signed}"))
    assert stack.is_storage_url(urlsplit(f"https://s3.eu-west-1.amazonaws.com/{BUCKET}/files/t/file-1{signed}"))
    assert not stack.is_storage_url(urlsplit(f"https://other-bucket.s3.eu-west-1.amazonaws.com/{BUCKET}x/f{signed}"))
    assert not stack.is_storage_url(urlsplit(f"{API_URL}/files/file-1/content"))


@mock_aws
def test_keys_are_batchctls_for_tenants_of_this_run_and_revoked_at_the_end(tmp_path: Path) -> None:
    """On moto's CloudFormation and DynamoDB: the stack's outputs name the table; the keys the suite
    makes authenticate as tenants of this run (another run's differ), and close() revokes them even
    when deleting their files fails."""
    region = "us-east-1"
    boto3.client("dynamodb", region_name=region).create_table(TableName=TABLE, **schema.TABLE_SCHEMA)
    dead_api = "http://127.0.0.1:9/prod/v1"  # nothing answers: file cleanup fails, revoking must not
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {k: {"Value": v} for k, v in {**ALL_OUTPUTS, "ApiUrl": dead_api}.items()},
    }
    boto3.client("cloudformation", region_name=region).create_stack(
        StackName=names.STACK_NAME, TemplateBody=json.dumps(template)
    )

    settings = e2e_target.E2ESettings(kind="aws", key_cache_seconds=0)
    stack = e2e_target.open_stack(
        settings,
        cloudformation=batchctl_targets.cloudformation(),
        operator_env={"AWS_REGION": region},
        state_dir=tmp_path,
    )
    other_run = e2e_target.open_stack(
        settings, cloudformation=batchctl_targets.cloudformation(), operator_env={}, state_dir=tmp_path
    )
    assert stack.base_url == dead_api and stack.target.table_name == TABLE

    key = stack.new_key("other")
    assert auth.resolve_tenant(stack.keys, f"Bearer {key}") == stack.tenant("other") != other_run.tenant("other")
    assert stack.tenant("other").endswith(".other") and len(stack.tenant("x" * 80)) == 64
    env = stack.env  # makes the session's default key
    assert env["BATCHAPI_STACK"] == "BatchApi" and env["AWS_REGION"] == region
    assert env[local_state.STATE_DIR_ENV] == str(tmp_path)  # batchctl finds no `make up` there
    assert auth.resolve_tenant(stack.keys, f"Bearer {env['BATCHAPI_API_KEY']}") == stack.tenant("default")

    problems = stack.close()
    assert len(problems) == 2 and all(p.startswith("deleting the files of a test key") for p in problems)
    for revoked in (key, env["BATCHAPI_API_KEY"]):
        with pytest.raises(AuthenticationFailed, match="Incorrect API key"):
            auth.resolve_tenant(stack.keys, f"Bearer {revoked}")
    assert stack.created == []


def test_eventually_tries_at_once_then_until_the_bound() -> None:
    now, slept, answers = [0.0], [], iter([False, False, True])

    def clock() -> float:
        return now[0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    assert e2e_target.eventually(lambda: next(answers), within=300, interval=5, clock=clock, sleep=sleep)
    assert slept == [5, 5]
    now[0], slept[:] = 0.0, []
    calls = []
    assert e2e_target.eventually(
        lambda: calls.append(1) or True, within=0, clock=clock, sleep=sleep
    )  # local: one try...
    assert not e2e_target.eventually(lambda: calls.append(1) or False, within=0, clock=clock, sleep=sleep)
    assert (calls, slept) == ([1, 1], [])  # ...and no wait
    assert not e2e_target.eventually(lambda: False, within=12, interval=5, clock=clock, sleep=sleep)
    assert slept == [5, 5, 5]


class FakeSdk:
    """The few SDK calls warm_up makes; each batch's statuses are scripted per model."""

    def __init__(self, script: dict[str, list[str]]):
        self.script, self.uploaded, self.created, self.by_id = script, {}, [], {}
        self.files = SimpleNamespace(create=self._file)
        self.batches = SimpleNamespace(create=self._batch, retrieve=self._retrieve)

    def _file(self, file, purpose):
        file_id = f"file-{len(self.uploaded)}"
        self.uploaded[file_id] = json.loads(file[1])
        return SimpleNamespace(id=file_id)

    def _batch(self, input_file_id, endpoint, completion_window):
        line = self.uploaded[input_file_id]
        assert (line["url"], completion_window) == (endpoint, "24h")
        batch_id = f"batch-{len(self.created)}"
        self.created.append((line["body"]["model"], endpoint))
        self.by_id[batch_id] = iter(self.script[line["body"]["model"]])
        return SimpleNamespace(id=batch_id)

    def _retrieve(self, batch_id):
        return SimpleNamespace(status=next(self.by_id[batch_id]))


def test_warm_up_starts_every_model_at_once_and_waits_for_all() -> None:
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    sdk = FakeSdk({"chat-m": ["validating", "in_progress", "completed"], "embed-m": ["in_progress", "completed"]})
    statuses = e2e_target.warm_up(
        sdk,
        {"chat-m": "/v1/chat/completions", "embed-m": "/v1/embeddings"},
        within=1800,
        interval=15,
        clock=lambda: now[0],
        sleep=sleep,
    )
    assert statuses == {"chat-m": "completed", "embed-m": "completed"}
    assert sdk.created == [("chat-m", "/v1/chat/completions"), ("embed-m", "/v1/embeddings")]  # both before any wait
    assert slept == [15, 15]
    assert sdk.uploaded["file-0"]["body"]["max_tokens"] == 1 and sdk.uploaded["file-1"]["body"]["input"] == "warm up"

    now[0], slept[:] = 0.0, []
    stuck = FakeSdk({"chat-m": ["in_progress"] * 100})
    assert e2e_target.warm_up(
        stuck, {"chat-m": "/v1/chat/completions"}, within=60, interval=15, clock=lambda: now[0], sleep=sleep
    ) == {"chat-m": "in_progress"}
    assert slept == [15, 15, 15, 15]  # gives up at the bound


# --- Which tests run where -------------------------------------------------------------------------
#: Every local_only test of the suite's four files (a test added to this list is a test that stops
#: running against a deployed stack: it must need the local deployment itself).
EXPECTED_LOCAL_ONLY = {
    "tests/e2e/test_local_api.py::test_ready_line_and_state_file",
    "tests/e2e/test_local_api.py::test_signal_stops_everything[ctrl-c]",
    "tests/e2e/test_local_api.py::test_signal_stops_everything[sigterm]",
    "tests/e2e/test_batches_e2e.py::test_lines_the_engine_rejects_land_in_the_error_file",
    "tests/e2e/test_batches_e2e.py::test_cancel_mid_run_keeps_partial_output",
    "tests/e2e/test_batches_e2e.py::test_short_window_expires_with_batch_expired_lines",
    "tests/e2e/test_recovery_e2e.py::test_a_batch_completes_after_its_chat_process_is_killed_mid_run[worker]",
    "tests/e2e/test_recovery_e2e.py::test_a_batch_completes_after_its_chat_process_is_killed_mid_run[engine]",
    "tests/e2e/test_e2e_target.py::test_rehearsal_the_aws_mode_against_a_local_deployment_dressed_as_a_stack",
}
SUITE_FILES = ("test_local_api.py", "test_batches_e2e.py", "test_recovery_e2e.py", "test_e2e_target.py")


def collected(tmp_path: Path, *args: str, target: str = "local") -> list[dict]:
    report = tmp_path / "collected.json"
    env = clean_env(**{e2e_target.COLLECT_REPORT_ENV: str(report), e2e_target.TARGET_ENV: target})
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.e2e.target",
            "--collect-only",
            *args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(report.read_text())


def test_local_only_tests_are_exactly_those_that_need_local_state(tmp_path: Path) -> None:
    rows = collected(tmp_path, "tests/e2e")
    assert len(rows) > 30
    for row in rows:  # the local deployment's fixtures <=> local_only, in every e2e test
        uses_local = sorted(e2e_target.LOCAL_FIXTURES & set(row["fixtures"]))
        if uses_local:
            assert row["local_only"], f"{row['id']} uses {uses_local} and is not marked local_only"
        if row["local_only"] is not None:
            assert row["local_only"], f"{row['id']}: local_only needs a reason"
    marked = {
        r["id"]
        for r in rows
        if r["local_only"] is not None and r["id"].split("::")[0].rsplit("/", 1)[-1] in SUITE_FILES
    }
    assert marked == EXPECTED_LOCAL_ONLY
    # The rest reach the deployment only through `deployment` / `deployment_with_models`.
    for row in rows:
        if (
            row["id"].startswith(("tests/e2e/test_local_api.py", "tests/e2e/test_batches_e2e.py"))
            and row["local_only"] is None
        ):
            assert {"deployment", "deployment_with_models"} & set(row["fixtures"]), row["id"]


def test_aws_mode_skips_local_only_tests_and_starts_nothing_local(tmp_path: Path) -> None:
    """With the AWS target and only local_only tests selected, every one is skipped with its
    reason, before any fixture: no local deployment is started and no AWS call is made (the
    environment has no credentials and a dead proxy)."""
    basetemp, junit = tmp_path / "run", tmp_path / "junit.xml"
    env = clean_env(
        **{e2e_target.TARGET_ENV: "aws", "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--basetemp={basetemp}",
            f"--junitxml={junit}",
            "-m",
            "local_only",
            "tests/e2e/test_local_api.py",
            "tests/e2e/test_recovery_e2e.py",
            "tests/e2e/test_batches_e2e.py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcomes = junit_outcomes(junit)
    expected = {i for i in EXPECTED_LOCAL_ONLY if "test_e2e_target.py" not in i}
    assert set(outcomes) == {i.split("::", 1)[1] for i in expected}
    assert all(kind == "skipped" and reason.startswith("local_only on aws: ") for kind, reason in outcomes.values()), (
        outcomes
    )
    assert list(basetemp.rglob("infra-local.log")) == []  # no local deployment was started


def junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """{test name: (passed|skipped|failed|error, message)} from a JUnit XML report."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kind, message = "passed", ""
        for child in case:
            if child.tag in ("skipped", "failure", "error"):
                kind, message = {"failure": "failed"}.get(child.tag, child.tag), child.get("message", "")
        outcomes[case.get("name")] = (kind, message)
    return outcomes


@pytest.mark.e2e
@pytest.mark.local_only("rehearses the AWS mode against a local deployment of its own, dressed as a stack")
def test_rehearsal_the_aws_mode_against_a_local_deployment_dressed_as_a_stack(start_local, tmp_path: Path) -> None:
    """``make e2e-aws`` for real, with the local deployment as the "account": its moto gets a
    CloudFormation stack whose outputs are the local API's URL, table and bucket, and the API
    suite runs with BATCHAPI_E2E_TARGET=aws and AWS_ENDPOINT_URL pointing boto3 (the suite's and
    batchctl's) at that moto. Every test not marked local_only passes, through the stack's
    outputs and keys made from them; the local_only ones are skipped; the run starts nothing
    local; its keys are revoked at the end."""
    local = start_local(tmp_path / "local")
    try:
        state = local.state
        template = {
            "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
            "Outputs": {
                names.OUTPUT_API_URL: {"Value": state.api_base_url},
                names.OUTPUT_TABLE: {"Value": state.table_name},
                names.OUTPUT_BUCKET: {"Value": state.bucket_name},
            },
        }
        moto = dict(
            aws_access_key_id=local_state.ACCESS_KEY_ID,
            aws_secret_access_key=local_state.SECRET_ACCESS_KEY,
            region_name=state.region,
            endpoint_url=state.moto_endpoint,
        )
        boto3.client("cloudformation", **moto).create_stack(StackName="Rehearsal", TemplateBody=json.dumps(template))
        keys_before = key_count(moto, state.table_name)

        basetemp, junit = tmp_path / "run", tmp_path / "junit.xml"
        env = clean_env(
            **{
                e2e_target.TARGET_ENV: "aws",
                "BATCHAPI_STACK": "Rehearsal",
                e2e_target.KEY_CACHE_ENV: "0",
                "AWS_ENDPOINT_URL": state.moto_endpoint,
                "AWS_REGION": state.region,
                "AWS_ACCESS_KEY_ID": local_state.ACCESS_KEY_ID,
                "AWS_SECRET_ACCESS_KEY": local_state.SECRET_ACCESS_KEY,
            }
        )
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--basetemp={basetemp}",
                f"--junitxml={junit}",
                "tests/e2e/test_local_api.py",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
        outcomes = junit_outcomes(junit)
        skipped = {name for name, (kind, _) in outcomes.items() if kind == "skipped"}
        assert skipped == {
            "test_ready_line_and_state_file",
            "test_signal_stops_everything[ctrl-c]",
            "test_signal_stops_everything[sigterm]",
        }
        assert all(kind == "passed" for name, (kind, _) in outcomes.items() if name not in skipped), outcomes
        assert len(outcomes) - len(skipped) >= 15
        assert list(basetemp.rglob("infra-local.log")) == []  # the AWS mode started no local deployment
        assert key_count(moto, state.table_name) == keys_before  # every key it made is revoked
    finally:
        code = local.stop()
    assert code == 0, local.log()


def key_count(moto: dict, table: str) -> int:
    items = boto3.resource("dynamodb", **moto).Table(table).scan()["Items"]
    return sum(1 for item in items if str(item.get("pk", "")).startswith("KEY#"))
