"""The role-by-role IAM table of docs/security.md, rendered from the synthesized template: every
IAM role of the stack, what it is for, and each statement its policies allow (actions, resources
named by their construct paths, the conditions that narrow them), then the table's resource
policy (the Deny statements every principal meets). ``tests/infra/test_iam_table.py`` asserts
that the doc holds exactly this rendering; regenerate it with

    .venv/bin/python -m tests.infra.iam_table --write
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from aws_cdk import CfnResource

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
START, END = "<!-- iam-table:start -->", "<!-- iam-table:end -->"

#: What each role is for, by its construct path (the stack's name and "/Resource" left out; the
#: test's two models are Model0 and Model1). A role the stack gains must be described here.
PURPOSE: dict[str, str] = {
    "Api/ApiFunctionRole": "The API Lambda (files, uploads, batches, webhook endpoints; every tenant's, by its key)",
    "Api/AuthorizerFunctionRole": "The API key authorizer (reads key items only)",
    "Api/RestApi/CloudWatchRole": "API Gateway's account-level role for its execution logs",
    "Audit/AppenderRole": "The audit appender: the only writer of audit chains and of token budgets",
    "BucketNotificationsHandler050a0587b7544547bf325f094a3db834/Role": "CDK's custom resource that sets the bucket's event notifications at deploy time",
    "Ingest/DeadLetterFunctionRole": "The chunk DLQ consumer: fails a dead-lettered chunk's lines and counts it",
    "Ingest/FunctionRole": "Ingest: validates a batch's lines and enqueues its chunks",
    "Ingest/IngestDeadLetterFunctionRole": "The ingest DLQ consumer: fails a batch whose ingest kept failing",
    "Reaper/FunctionRole": "The reaper (table stream): removes a deleted file's bytes, releases stored bytes",
    "StreamFront/Task/ExecutionRole": "ECS pulling the streaming front's image and writing its logs",
    "StreamFront/Task/TaskRole": "The streaming front (large files and parts in, file content out; every tenant's, by its key)",
    "StreamFront/Vpc/FlowLogs/IAMRole": "The streaming front's VPC flow logs to CloudWatch Logs",
    "Sweeper/FunctionRole": "The sweeper: ends batches whose workflow was lost, expires what is due",
    "Uploads/FunctionRole": "The upload assembler: streams a completed Upload's parts into its File",
    "Webhooks/FunctionRole": "The webhook fan-out: reads the batch back, signs and posts",
    "Workers/Model0/InstanceRole": "The GPU instances of model 0 (ECS agent)",
    "Workers/Model0/Task/ExecutionRole": "ECS pulling model 0's image, writing its logs, reading its secrets",
    "Workers/Model0/Task/TaskRole": "The GPU worker of model 0 (vLLM runs without these credentials)",
    "Workers/Model1/InstanceRole": "The GPU instances of model 1 (ECS agent)",
    "Workers/Model1/Task/ExecutionRole": "ECS pulling model 1's image, writing its logs, reading its secrets",
    "Workers/Model1/Task/TaskRole": "The GPU worker of model 1 (vLLM runs without these credentials)",
    "Workers/Network/Vpc/FlowLogs/IAMRole": "VPC flow logs to CloudWatch Logs",
    "Workers/Scaler/FunctionRole": "The scaler: sets each model's task count from its queue",
    "Workflow/FunctionRole": "The workflow's Lambda: registers, finalizes and expires a batch",
    "Workflow/StateMachine/Role": "The Step Functions state machine: invokes the workflow Lambda, publishes batch events",
}


def _paths(stack: Any) -> dict[str, str]:
    """Logical id -> construct path (without the stack's name and a trailing ``/Resource``)."""
    out = {}
    for node in stack.node.find_all():
        if isinstance(node, CfnResource):
            path = node.node.path.split("/", 1)[1].removesuffix("/Resource").removesuffix("/Default")
            out[stack.resolve(stack.get_logical_id(node))] = path
    return out


def _render(value: Any, paths: dict[str, str]) -> str:
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return f"<{paths.get(value['Ref'], value['Ref'])}>"
    if "Fn::GetAtt" in value:
        resource, attribute = value["Fn::GetAtt"]
        name = paths.get(resource, resource)
        return f"<{name}>" if attribute == "Arn" else f"<{name}.{attribute}>"
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(_render(p, paths) for p in parts)
    if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        return value["Fn::Sub"].replace("${", "<").replace("}", ">")
    return json.dumps(value, sort_keys=True)


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _actions(actions: list[str]) -> str:
    """``service:A, B`` per service, in order."""
    by_service: dict[str, list[str]] = {}
    for action in actions:
        service, _, verb = action.partition(":")
        by_service.setdefault(service, []).append(verb)
    return "; ".join(f"{service}:{', '.join(verbs)}" for service, verbs in by_service.items())


def _condition(condition: dict[str, Any], paths: dict[str, str]) -> str:
    parts = []
    for operator, tests in condition.items():
        for key, values in tests.items():
            shown = ", ".join(_render(v, paths) for v in _listed(values))
            parts.append(f"{operator} {key} [{shown}]")
    return "; ".join(parts)


def _cell(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def statement_text(statement: dict[str, Any], paths: dict[str, str]) -> str:
    actions = _actions(_listed(statement["Action"]))
    resources = ", ".join(_render(r, paths) for r in _listed(statement["Resource"]))
    text = f"{actions} on {resources}"
    if statement.get("Condition"):
        text += f" if {_condition(statement['Condition'], paths)}"
    return _cell(text)


def _account_arn(text: str) -> str:
    return re.sub(r"arn:<AWS::Partition>", "arn:aws", text)


def rows(stack: Any, template: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """(role path, purpose, statements) for every IAM role in the template, by path."""
    paths = _paths(stack)
    resources = template["Resources"]
    out = []
    for role_id, role in resources.items():
        if role["Type"] != "AWS::IAM::Role":
            continue
        path = paths[role_id]
        statements = [
            _cell("managed policy " + _account_arn(_render(arn, paths)).rsplit("/", 1)[-1])
            for arn in role["Properties"].get("ManagedPolicyArns", [])
        ]
        for policy in resources.values():
            if policy["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in policy["Properties"]["Roles"]:
                for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
                    assert statement["Effect"] == "Allow", (path, statement)
                    statements.append(statement_text(statement, paths))
        out.append((path, PURPOSE.get(path, ""), statements))
    return sorted(out)


def table_policy(stack: Any, template: dict[str, Any]) -> list[str]:
    """The table's resource-policy statements, as ``Sid: Effect ...`` lines."""
    paths = _paths(stack)
    (table,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::DynamoDB::Table"]
    policy = table["Properties"].get("ResourcePolicy")
    if policy is None:
        return []
    out = []
    for s in policy["PolicyDocument"]["Statement"]:
        actions = _actions(_listed(s["Action"]))
        out.append(
            f"| {s.get('Sid', '')} | {s['Effect']} | {_cell(actions)} | {_cell(_condition(s['Condition'], paths))} |"
        )
    return out


def render(stack: Any, template: dict[str, Any]) -> str:
    lines = [START, "", "| Role (construct path) | For | Allowed (each statement of its policies) |", "|---|---|---|"]
    for path, purpose, statements in rows(stack, template):
        lines.append(f"| `{path}` | {purpose} | {'<br>'.join(statements) or '(nothing)'} |")
    lines += [
        "",
        "The table's resource policy (met by every principal, whatever its identity policy allows):",
        "",
        "| Sid | Effect | Actions | When |",
        "|---|---|---|---|",
        *table_policy(stack, template),
        "",
        END,
    ]
    return "\n".join(lines)


def documented() -> str:
    text = DOC.read_text()
    start, end = text.index(START), text.index(END) + len(END)
    return text[start:end]


def _synth() -> tuple[Any, dict[str, Any]]:
    import os
    import tempfile

    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from infra.app import build
    from infra.config import CONTEXT_KEY
    from tests.infra.conftest import CONFIG

    app, stack = build({CONTEXT_KEY: CONFIG}, outdir=tempfile.mkdtemp())
    artifact = app.synth().get_stack_by_name(stack.stack_name)
    return stack, json.loads(Path(artifact.template_full_path).read_text())


def main(argv: list[str]) -> int:
    stack, template = _synth()
    rendered = render(stack, template)
    if "--write" in argv:
        text = DOC.read_text()
        DOC.write_text(text.replace(documented(), rendered))
        return 0
    print(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
