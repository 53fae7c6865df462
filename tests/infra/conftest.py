"""One CDK synth per test session: the app as ``cdk synth`` builds it (cdk-nag on) into a
temporary cloud assembly, with a config that exercises what the default one does not (two models,
one on Spot with an On-Demand base, an embeddings model, a Hugging Face token secret, the audit
chains' Object Lock bucket with a short retention). ``make synth``
checks the default config (cdk-nag, cfn-lint). Every infra test reads this one result."""

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

from aws_cdk.assertions import Template

from infra.app import build
from infra.config import CONTEXT_KEY
from infra.stack import BatchApiStack

#: The deployment config of the session synth (a deployment's ``-c batchapi=...``).
CONFIG: dict[str, Any] = {
    "models": [
        {
            "name": "org/Chat-Model-7B",
            "engine_args": ["--max-model-len", "8192"],
            "max_instances": 3,
            "backlog_per_task": 20,
            "idle_minutes": 15,
            "hf_token_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:hf-token-AbCdEf",
        },
        {
            "name": "embed-small",
            "endpoints": ["/v1/embeddings"],
            "instance_type": "g5.xlarge",
            "min_instances": 0,
            "max_instances": 4,
            "spot": True,
            "spot_weight": 3,
            "on_demand_base": 1,
            "backlog_per_task": 50,
            "idle_minutes": 10,
            "worker": {"drain_seconds": 60, "max_in_flight": 256},
        },
    ],
    "audit_object_lock": {"mode": "governance", "retention_days": 30},
}


@dataclass(frozen=True)
class Synth:
    stack: BatchApiStack
    template: Template
    #: The synthesized template as a dict (for checks aws_cdk.assertions cannot express).
    json: dict[str, Any]
    template_path: Path
    outdir: Path

    def resources(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: r for k, r in self.json["Resources"].items() if r["Type"] == type_}

    def one(self, type_: str) -> tuple[str, dict[str, Any]]:
        found = self.resources(type_)
        assert len(found) == 1, f"expected one {type_}, found {sorted(found)}"
        return next(iter(found.items()))

    @property
    def config(self) -> Any:
        """The stack's ``DeployConfig``."""
        return self.stack.config

    def render(self, value: Any) -> Any:
        """A template value as text: ``{"Ref": id}`` -> ``<id>``, ``{"Fn::GetAtt": [id, attr]}`` ->
        ``<id.attr>``, ``Fn::Join`` joined (so tokens can be compared with placeholders)."""
        if isinstance(value, str | int | float):
            return str(value)
        if "Ref" in value:
            return f"<{value['Ref']}>"
        if "Fn::GetAtt" in value:
            return "<{}.{}>".format(*value["Fn::GetAtt"])
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(self.render(part) for part in parts)
        if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
            return value["Fn::Sub"].replace("${", "<").replace("}", ">")
        raise AssertionError(f"cannot render {value!r}")

    def permissions(self, role_id: str) -> list[tuple[str, str]]:
        """(action, resource as JSON text) pairs a role is granted. Every grant of the stack is an
        Allow in the role's generated policy: no AWS-managed or inline policies on its roles."""
        role = self.json["Resources"][role_id]["Properties"]
        assert not role.get("ManagedPolicyArns"), "no AWS-managed policies on the stack's roles"
        assert not role.get("Policies"), "no inline policies besides the generated default policy"
        pairs = []
        for policy in self.resources("AWS::IAM::Policy").values():
            if {"Ref": role_id} not in policy["Properties"]["Roles"]:
                continue
            for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                assert statement["Effect"] == "Allow"
                actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                resources = (
                    statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
                )
                pairs += [(a, json.dumps(r)) for a in actions for r in resources]
        return pairs

    def logical_id(self, construct: Any) -> str:
        cfn = getattr(construct.node, "default_child", None) or construct
        return self.stack.resolve(self.stack.get_logical_id(cfn))


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    outdir = tmp_path_factory.mktemp("cdk.out")
    app, stack = build({CONTEXT_KEY: CONFIG}, outdir=str(outdir))
    # Raises (cdk-nag's ValidationFailed, listing the findings) if any finding is unacknowledged.
    assembly = app.synth()
    artifact = assembly.get_stack_by_name(stack.stack_name)
    path = Path(artifact.template_full_path)
    data = json.loads(path.read_text())
    return Synth(stack=stack, template=Template.from_json(data), json=data, template_path=path, outdir=outdir)
