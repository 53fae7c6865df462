"""The governance switch (docs/governance.md, "The switch") in the stack: with ``governance: false`` in the deployment
config, every function's settings say so and ingest gets no grant on the TENANTS partition; the
session synth (governance on, the default) keeps it (tests/infra/test_tenants_grant.py)."""

import json
from pathlib import Path

import pytest
from aws_cdk.assertions import Template

from functions.core import schema
from functions.core.settings import Settings
from functions.core.tenants import TenantPolicy
from infra.app import build
from infra.config import CONTEXT_KEY
from tests.infra.conftest import CONFIG, Synth
from tests.infra.test_table_access import _lambda_statements, allows_any


@pytest.fixture(scope="module")
def ungoverned(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    outdir = tmp_path_factory.mktemp("cdk.out.ungoverned")
    app, stack = build({CONTEXT_KEY: CONFIG | {"governance": False}}, outdir=str(outdir))
    artifact = app.synth().get_stack_by_name(stack.stack_name)
    path = Path(artifact.template_full_path)
    data = json.loads(path.read_text())
    return Synth(stack=stack, template=Template.from_json(data), json=data, template_path=path, outdir=outdir)


def _governance_env(synth: Synth) -> set[str]:
    name = Settings.env_name("governance")
    return {
        props["Environment"]["Variables"][name]
        for props in (r["Properties"] for r in synth.template.find_resources("AWS::Lambda::Function").values())
        if name in props.get("Environment", {}).get("Variables", {})
    }


def test_governance_off_removes_the_tenant_policy_grant(ungoverned: Synth) -> None:
    policy_pk = TenantPolicy(tenant="acme").to_item()[schema.PK]
    assert not allows_any(_lambda_statements(ungoverned, "ingest"), "dynamodb:GetItem", [policy_pk])
    assert ungoverned.stack.ingest.settings.governance is False
    assert _governance_env(ungoverned) == {"false"}


def test_governance_is_on_by_default(synth: Synth) -> None:
    policy_pk = TenantPolicy(tenant="acme").to_item()[schema.PK]
    assert allows_any(_lambda_statements(synth, "ingest"), "dynamodb:GetItem", [policy_pk])
    assert _governance_env(synth) == {"true"}
