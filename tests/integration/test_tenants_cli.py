"""``batchctl tenants create|get|set|list`` against the deployed stack on moto: the policy it writes
is the one the API enforces (no redeploy), ``set`` changes only what it is given, ``none``/``all``
clear a limit, and bad values exit 2 with a clear message."""

import io
import json
from pathlib import Path

import openai
import pytest

from batchctl import cli
from infra import names
from infra.local import state as local_state
from tests.integration.batch_helpers import line, submit
from tests.integration.test_batchctl import create_stack, stack_outputs


def run_cli(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), env=env, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {local_state.STATE_DIR_ENV: str(tmp_path / "state")}


@pytest.fixture
def stack(aws) -> None:
    create_stack(names.STACK_NAME, stack_outputs(aws))


def test_get_without_a_record_prints_the_defaults(stack: None, env: dict[str, str]) -> None:
    code, out, err = run_cli("tenants", "get", "--tenant", "acme", env=env)
    assert code == 0, err
    policy = json.loads(out)
    assert policy["allowed_models"] is None and policy["batches_per_hour"] is None
    assert policy["output_token_budget"] is None and policy["max_enqueued_requests"] == {}
    assert "defaults apply" in err


def test_create_then_the_api_enforces_it_and_set_changes_only_what_it_is_given(
    stack: None, env: dict[str, str], client, stores, clock
) -> None:
    clock.now = 1_699_956_000 + 60  # a minute into a clock hour: both creates fall in it
    code, _out, err = run_cli(
        "tenants",
        "create",
        "--tenant",
        "acme",
        "--batches-per-hour",
        "1",
        "--allowed-models",
        "test-chat,other",
        "--max-enqueued-tokens",
        "test-chat=5000",
        env=env,
    )
    assert code == 0, err
    assert stores.tenants.get("acme").batches_per_hour == 1

    content = (line(1) + "\n").encode()
    submit(client, content)
    with pytest.raises(openai.RateLimitError):
        submit(client, content)

    code, _out, err = run_cli(
        "tenants", "set", "--tenant", "acme", "--batches-per-hour", "none", "--max-enqueued-tokens", "other=7", env=env
    )
    assert code == 0, err
    policy = stores.tenants.get("acme")
    assert policy.batches_per_hour is None
    assert policy.allowed_models == ["test-chat", "other"]  # untouched
    assert policy.max_enqueued_tokens == {"test-chat": 5000, "other": 7}
    submit(client, content)  # no limit any more: admitted at once

    run_cli(
        "tenants",
        "set",
        "--tenant",
        "acme",
        "--allowed-models",
        "all",
        "--max-enqueued-tokens",
        "test-chat=none",
        env=env,
    )
    policy = stores.tenants.get("acme")
    assert policy.allowed_models is None and policy.max_enqueued_tokens == {"other": 7}


def test_create_refuses_an_existing_policy(stack: None, env: dict[str, str], stores) -> None:
    assert run_cli("tenants", "create", "--tenant", "acme", "--batches-per-hour", "3", env=env)[0] == 0
    code, out, err = run_cli("tenants", "create", "--tenant", "acme", "--batches-per-hour", "9", env=env)
    assert code == 1 and out == "" and "already has a policy" in err
    assert stores.tenants.get("acme").batches_per_hour == 3


def test_list_prints_every_policy(stack: None, env: dict[str, str]) -> None:
    run_cli("tenants", "set", "--tenant", "zeta", "--output-token-budget", "1000000", "--budget-period", "day", env=env)
    run_cli("tenants", "create", "--tenant", "acme", env=env)
    code, out, err = run_cli("tenants", "list", env=env)
    assert code == 0, err
    rows = [json.loads(row) for row in out.splitlines()]
    assert [r["tenant"] for r in rows] == ["acme", "zeta"]
    assert (rows[1]["output_token_budget"], rows[1]["budget_period"]) == (1_000_000, "day")


@pytest.mark.parametrize(
    "argv",
    [
        ["--batches-per-hour", "-1"],
        ["--batches-per-hour", "many"],
        ["--max-enqueued-requests", "no-equals"],
        ["--budget-period", "week"],
        ["--allowed-models", ","],
    ],
)
def test_bad_values_exit_2(argv: list[str], env: dict[str, str], capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["tenants", "set", "--tenant", "acme", *argv], env=env)
    assert info.value.code == 2
    assert capsys.readouterr().err


def test_set_takes_the_line_bounds_the_input_budget_and_the_output_reservation(
    stack: None, env: dict[str, str], stores
) -> None:
    code, _out, err = run_cli(
        "tenants",
        "set",
        "--tenant",
        "acme",
        "--line-max-n",
        "4",
        "--line-max-output-tokens",
        "2048",
        "--input-token-budget",
        "500000",
        "--reserve-output-tokens",
        "on",
        env=env,
    )
    assert code == 0, err
    policy = stores.tenants.get("acme")
    assert (policy.line_bounds.max_n, policy.line_bounds.max_output_tokens, policy.line_bounds.max_inputs) == (
        4,
        2048,
        None,
    )
    assert (policy.input_token_budget, policy.reserve_output_tokens) == (500_000, True)
    run_cli("tenants", "set", "--tenant", "acme", "--line-max-n", "none", "--line-max-inputs", "16", env=env)
    bounds = stores.tenants.get("acme").line_bounds
    assert (bounds.max_n, bounds.max_inputs, bounds.max_output_tokens) == (
        None,
        16,
        2048,
    )  # only what was given changed


def test_a_zero_line_bound_is_an_invalid_policy(env: dict[str, str], stack: None) -> None:
    code, _, err = run_cli("tenants", "set", "--tenant", "acme", "--line-max-n", "0", env=env)
    assert code == 2 and "invalid policy" in err


def test_reserve_output_tokens_takes_on_or_off_only(env: dict[str, str], capsys) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["tenants", "set", "--tenant", "acme", "--reserve-output-tokens", "yes"], env=env)
    assert info.value.code == 2 and "expected on or off" in capsys.readouterr().err


def test_set_takes_the_media_allowlist_and_none_stores_an_empty_one(stack: None, env: dict[str, str], stores) -> None:
    code, _out, err = run_cli(
        "tenants", "set", "--tenant", "acme", "--allowed-media-domains", "CDN.example.org,media.example.com", env=env
    )
    assert code == 0, err
    assert stores.tenants.get("acme").allowed_media_domains == ["cdn.example.org", "media.example.com"]
    run_cli("tenants", "set", "--tenant", "acme", "--allowed-media-domains", "none", env=env)
    assert stores.tenants.get("acme").allowed_media_domains == []  # data: URLs only, stored as such
    code, out, _ = run_cli("tenants", "get", "--tenant", "acme", env=env)
    assert code == 0 and json.loads(out)["allowed_media_domains"] == []
    run_cli("tenants", "set", "--tenant", "acme", "--allowed-media-domains", "all", env=env)
    assert stores.tenants.get("acme").allowed_media_domains is None  # the deployment's again


def test_a_media_domain_that_is_not_a_host_is_an_invalid_policy(stack: None, env: dict[str, str]) -> None:
    code, _, err = run_cli(
        "tenants", "set", "--tenant", "acme", "--allowed-media-domains", "https://x.example", env=env
    )
    assert code == 2 and "media domains must be host names" in err
