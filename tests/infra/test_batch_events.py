"""The batch event bus (infra/constructs/events.py, docs/webhooks.md "Who may publish"): the
stack's own bus carries the batch lifecycle events, its policy denies PutEvents to every principal
but the publishers' roles, exactly the roles IAM lets put events, and both consumers' rules are on
it. Nothing of the stack puts events on the default bus."""

import json

from infra import names
from infra.constructs.events import ONLY_PUBLISHERS_SID, PUT_EVENTS

from .test_lambdas import _functions

#: The functions that publish batch lifecycle events (lifecycle.publish_status's callers).
PUBLISHERS = ("ingest", "ingest_dlq", "workflow", "sweeper")


def _bus(synth) -> tuple[str, dict]:
    logical = synth.logical_id(synth.stack.events.bus)
    return logical, synth.json["Resources"][logical]["Properties"]


def _role(synth, label: str) -> str:
    return _functions(synth)[label][1]["Role"]["Fn::GetAtt"][0]


def test_the_bus_is_the_stacks_own_and_every_function_publishes_to_it(synth):
    _, bus = _bus(synth)
    assert bus["Name"] == names.event_bus_name(names.STACK_NAME) != "default"
    for label, (_, props) in _functions(synth).items():
        if label != "scaler":  # its own two variables (tests/infra/test_scaler.py)
            assert props["Environment"]["Variables"]["BATCHAPI_EVENT_BUS_NAME"] == bus["Name"], label


def test_the_bus_policy_denies_put_events_to_everyone_but_the_publishers(synth):
    bus_id, _ = _bus(synth)
    [policy] = [p["Properties"] for p in synth.resources("AWS::Events::EventBusPolicy").values()]
    assert policy["EventBusName"] == {"Ref": bus_id}
    statement = policy["Statement"]
    assert statement["Sid"].endswith(ONLY_PUBLISHERS_SID)
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == ("Deny", {"AWS": "*"}, PUT_EVENTS)
    assert statement["Resource"] == {"Fn::GetAtt": [bus_id, "Arn"]}
    [(operator, keys)] = statement["Condition"].items()
    assert operator == "ArnNotEquals" and set(keys) == {"aws:PrincipalArn"}
    admitted = {arn["Fn::GetAtt"][0] for arn in keys["aws:PrincipalArn"]}
    assert all(arn["Fn::GetAtt"][1] == "Arn" for arn in keys["aws:PrincipalArn"])
    assert admitted == {_role(synth, label) for label in PUBLISHERS}


def test_only_the_admitted_roles_may_put_events_anywhere(synth):
    """IAM and the bus policy agree: the roles allowed PutEvents are exactly the admitted ones, and
    they may put events on this bus only (not on the default bus, where anyone could)."""
    bus_id, _ = _bus(synth)
    allowed: dict[str, set[str]] = {}
    for policy in synth.resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if not any(a in (PUT_EVENTS, "events:*", "*") for a in actions):
                continue
            resources = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            for role in policy["Properties"]["Roles"]:
                allowed.setdefault(role["Ref"], set()).update(json.dumps(r) for r in resources)
    assert set(allowed) == {_role(synth, label) for label in PUBLISHERS}
    assert all(r == {json.dumps({"Fn::GetAtt": [bus_id, "Arn"]})} for r in allowed.values()), allowed


def test_the_webhook_and_the_batch_events_log_rules_are_on_the_bus(synth):
    bus_id, _ = _bus(synth)
    rules = {
        k: r["Properties"]
        for k, r in synth.resources("AWS::Events::Rule").items()
        if r["Properties"].get("EventPattern", {}).get("source") == ["batch-api"]
    }
    webhook_rule = synth.logical_id(synth.stack.webhooks.rule)
    assert webhook_rule in rules and len(rules) == 2  # the webhook fan-out, the batch events log
    assert all(r["EventBusName"] == {"Ref": bus_id} for r in rules.values())
