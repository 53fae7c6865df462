"""batchctl against moto: keys it creates authenticate through the API, revoked keys get 401, and
it finds its target (the local deployment if one runs, else the stack's outputs on AWS)."""

import io
import json
import socket
from pathlib import Path

import pytest
from openai import AuthenticationError, OpenAI

from batchctl import cli, targets
from batchctl.settings import STACK_ENV
from functions.core import auth, clients
from functions.core.settings import Settings
from infra import names
from infra.local import state as local_state
from tests.helpers import sdk_client


def run_cli(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), env=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def create_stack(name: str, outputs: dict[str, str]) -> None:
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    clients.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def stack_outputs(settings: Settings) -> dict[str, str]:
    """The outputs of a stack of ``settings`` (with governance on, its audit queue, Object Lock
    bucket and, where the settings name one, KMS signing key)."""
    audit = {
        names.OUTPUT_AUDIT_QUEUE: settings.audit_queue_url,
        names.OUTPUT_AUDIT_BUCKET: settings.audit_bucket_name,
        names.OUTPUT_AUDIT_KEY: settings.audit_signing_key_id,
    }
    return {
        names.OUTPUT_TABLE: settings.table_name,
        names.OUTPUT_BUCKET: settings.bucket_name,
        names.OUTPUT_API_URL: "https://api.example/prod/",
        **{name: value for name, value in audit.items() if value},
    }


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """batchctl's environment: a state directory where no local deployment runs."""
    return {local_state.STATE_DIR_ENV: str(tmp_path / "state")}


@pytest.fixture
def stack(aws: Settings) -> None:
    """The deployed stack (on moto): its outputs name the table the API uses."""
    create_stack(names.STACK_NAME, stack_outputs(aws))


def sdk(api_url: str, key: str) -> OpenAI:
    return sdk_client(api_url, key, max_retries=0)


# --- keys create / revoke ---------------------------------------------------------------------
def test_created_key_authenticates_as_its_tenant(stack: None, env: dict[str, str], api_url: str, stores) -> None:
    code, out, err = run_cli("keys", "create", "--tenant", "newco", env=env)

    assert code == 0, err
    key = out.strip()
    assert key.startswith("sk-") and len(key) > 40 and "\n" not in key
    assert f"stack {names.STACK_NAME}" in err
    assert stores.keys.get(auth.hash_key(key)).tenant == "newco"
    client = sdk(api_url, key)
    created = client.files.create(file=("notes.txt", b"hello"), purpose="user_data")
    assert [f.id for f in client.files.list()] == [created.id]


def test_keys_are_stored_only_as_hashes(stack: None, env: dict[str, str], settings: Settings) -> None:
    key = run_cli("keys", "create", "--tenant", "newco", env=env)[1].strip()

    items = clients.dynamodb_table(settings.table_name).scan()["Items"]
    assert items and key not in json.dumps(items, default=str)


def test_each_create_makes_a_new_key(stack: None, env: dict[str, str]) -> None:
    first = run_cli("keys", "create", "--tenant", "newco", env=env)[1].strip()
    second = run_cli("keys", "create", "--tenant", "newco", env=env)[1].strip()
    assert first != second


def test_revoked_key_gets_401(stack: None, env: dict[str, str], api_url: str, keys: dict[str, str]) -> None:
    key = run_cli("keys", "create", "--tenant", "newco", env=env)[1].strip()
    sdk(api_url, key).files.list()  # works before

    code, out, err = run_cli("keys", "revoke", key, env=env)

    assert code == 0, err
    assert "'newco'" in out
    with pytest.raises(AuthenticationError) as info:
        sdk(api_url, key).files.list()
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"
    sdk(api_url, keys["acme"]).files.list()  # other keys are untouched


def test_revoking_an_unknown_key_fails(stack: None, env: dict[str, str]) -> None:
    code, out, err = run_cli("keys", "revoke", "sk-not-a-key", env=env)
    assert code == 1
    assert out == ""
    assert "no such key" in err


@pytest.mark.parametrize("tenant", ["", "bad name", "-leading-dash", "x" * 65, "tenant/with/slash"])
def test_invalid_tenant_exits_2_with_a_clear_message(tenant: str, env: dict[str, str], capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["keys", "create", f"--tenant={tenant}"], env=env)
    assert info.value.code == 2
    assert "invalid tenant name" in capsys.readouterr().err


def test_missing_command_exits_2(env: dict[str, str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["keys"], env=env)
    assert info.value.code == 2


# --- AWS target: the stack's outputs ----------------------------------------------------------
def test_stack_name_from_env_or_flag(aws: None, settings: Settings, env: dict[str, str]) -> None:
    create_stack("Staging", stack_outputs(settings))

    code, _, err = run_cli("keys", "create", "--tenant", "t1", env=env)
    assert code == 1
    assert names.STACK_NAME in err  # the default stack does not exist here

    code, _out, err = run_cli("keys", "create", "--tenant", "t1", env={**env, STACK_ENV: "Staging"})
    assert code == 0, err
    assert "stack Staging" in err

    code, _out, err = run_cli("--stack", "Staging", "keys", "create", "--tenant", "t1", env={**env, STACK_ENV: "Nope"})
    assert code == 0, err
    assert "stack Staging" in err


def test_stack_without_the_table_output_is_an_error(aws: None, env: dict[str, str]) -> None:
    create_stack(names.STACK_NAME, {names.OUTPUT_API_URL: "https://api.example/prod/"})
    code, out, err = run_cli("--aws", "keys", "create", "--tenant", "t1", env=env)
    assert code == 1
    assert out == ""
    assert names.OUTPUT_TABLE in err


# --- Target resolution ------------------------------------------------------------------------
STATE = local_state.LocalState(
    moto_endpoint="http://127.0.0.1:4566",
    api_base_url="http://127.0.0.1:8080/v1",
    table_name="batch-api-local",
    bucket_name="batch-api-local",
    pid=1,
)
AWS = targets.Target(kind="aws", table_name="from-stack")


def never(*_: object) -> bool:
    raise AssertionError("must not be called")


def aws_down() -> targets.Target:
    raise targets.TargetError("stack 'BatchApi' does not exist")


@pytest.mark.parametrize(
    ("mode", "state", "answers", "expected"),
    [
        (None, STATE, lambda s: True, "local"),
        (None, STATE, lambda s: False, "aws"),
        (None, None, never, "aws"),
        ("aws", STATE, never, "aws"),
        ("local", STATE, lambda s: True, "local"),
    ],
)
def test_resolve_target(mode, state, answers, expected) -> None:
    target = targets.resolve_target(mode, state=state, answers=answers, aws=lambda: AWS)
    assert target.kind == expected
    if expected == "local":
        assert (target.endpoint_url, target.table_name, target.region) == (
            STATE.moto_endpoint,
            STATE.table_name,
            STATE.region,
        )
    else:
        assert target is AWS


@pytest.mark.parametrize(("state", "answers"), [(None, never), (STATE, lambda s: False)])
def test_forced_local_without_a_running_deployment_fails(state, answers) -> None:
    with pytest.raises(targets.TargetError, match="make up"):
        targets.resolve_target("local", state=state, answers=answers, aws=never)


def test_auto_mode_explains_both_failures() -> None:
    with pytest.raises(targets.TargetError, match=r"no local deployment.*BatchApi"):
        targets.resolve_target(None, state=None, answers=never, aws=aws_down)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_stale_state_file_falls_back_to_aws(stack: None, env: dict[str, str]) -> None:
    """A state file left by a killed `make up` whose moto no longer answers is ignored."""
    stale = STATE.model_copy(update={"moto_endpoint": f"http://127.0.0.1:{closed_port()}"})
    stale.write(local_state.state_path(env))
    assert not targets.local_answers(stale)

    code, _out, err = run_cli("keys", "create", "--tenant", "newco", env=env)
    assert code == 0, err
    assert f"stack {names.STACK_NAME}" in err

    code, _, err = run_cli("--local", "keys", "create", "--tenant", "newco", env=env)
    assert code == 1
    assert "make up" in err


# --- The state file ---------------------------------------------------------------------------
def test_state_file_round_trip_and_location(tmp_path: Path) -> None:
    path = local_state.state_path({local_state.STATE_DIR_ENV: str(tmp_path / "s")})
    assert path == tmp_path / "s" / names.LOCAL_STATE_FILE
    assert local_state.LocalState.read(path) is None
    STATE.write(path)
    assert local_state.LocalState.read(path) == STATE
    path.write_text("{not json")
    assert local_state.LocalState.read(path) is None


def test_default_state_file_is_in_the_repo() -> None:
    repo = Path(__file__).resolve().parents[2]
    assert local_state.state_path({}) == repo / names.LOCAL_STATE_DIR / names.LOCAL_STATE_FILE
