"""The state machine in the template is the one the local deployment runs (infra/workflow.py),
wired to the workflow Lambda, with full logging and tracing."""

import json

from infra import names, workflow

from .test_lambdas import _functions, _permissions


def _state_machine(synth) -> tuple[str, dict]:
    return synth.one("AWS::StepFunctions::StateMachine")


def test_definition_is_the_one_the_local_deployment_runs(synth):
    _, sm = _state_machine(synth)
    props = sm["Properties"]
    assert props["DefinitionString"] == workflow.definition_json()
    # CloudFormation substitutes ${WorkflowFunctionArn} with the workflow Lambda's ARN ...
    assert props["DefinitionSubstitutions"] == {
        workflow.FUNCTION_PLACEHOLDER: {"Fn::GetAtt": [_functions(synth)["workflow"][0], "Arn"]}
    }
    # ... which is what infra.local renders for its function: the same states, byte for byte.
    arn = "arn:aws:lambda:us-east-1:123456789012:function:workflow"
    deployed = props["DefinitionString"]
    for key, _value in props["DefinitionSubstitutions"].items():
        deployed = deployed.replace("${" + key + "}", arn)
    assert deployed == workflow.render(arn)
    assert "${" not in deployed
    assert json.loads(deployed)["States"]["WaitForSignal"]["Parameters"]["FunctionName"] == arn


def test_named_as_the_settings_name_it(synth):
    _, sm = _state_machine(synth)
    assert sm["Properties"]["StateMachineName"] == names.state_machine_name(names.STACK_NAME)
    env = _functions(synth)["ingest"][1]["Environment"]["Variables"]
    assert synth.render(env["BATCHAPI_STATE_MACHINE_ARN"]).endswith(
        ":stateMachine:" + sm["Properties"]["StateMachineName"]
    )


def test_logs_everything_and_traces(synth):
    _, sm = _state_machine(synth)
    props = sm["Properties"]
    logging = props["LoggingConfiguration"]
    assert logging["Level"] == "ALL" and logging["IncludeExecutionData"] is True
    (destination,) = logging["Destinations"]
    group = destination["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert synth.json["Resources"][group]["Properties"]["RetentionInDays"] == synth.config.log_retention_days
    assert props["TracingConfiguration"] == {"Enabled": True}
    assert props.get("StateMachineType", "STANDARD") == "STANDARD"  # waits up to the completion window


def test_state_machine_invokes_only_the_workflow_lambda(synth):
    _, sm = _state_machine(synth)
    role = sm["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    fn = _functions(synth)["workflow"][0]
    invokes = set()
    for policy in synth.resources("AWS::IAM::Policy").values():
        if {"Ref": role} not in policy["Properties"]["Roles"]:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            if "lambda:InvokeFunction" in actions:
                assert actions == ["lambda:InvokeFunction"]
                invokes |= {json.dumps(r) for r in statement["Resource"]}
            else:  # log delivery and X-Ray only
                assert all(a.startswith(("logs:", "xray:")) for a in actions), actions
    assert invokes == {
        json.dumps({"Fn::GetAtt": [fn, "Arn"]}),
        json.dumps({"Fn::Join": ["", [{"Fn::GetAtt": [fn, "Arn"]}, ":*"]]}),
    }


def test_only_ingest_starts_executions(synth):
    sm = json.dumps({"Ref": synth.logical_id(synth.stack.workflow.state_machine)})
    starters = {label for label in _functions(synth) if ("states:StartExecution", sm) in _permissions(synth, label)}
    # ingest, and the two that restart a batch whose start failed (docs/lifecycle.md, "Liveness")
    assert starters == {"ingest", "ingest_dlq", "sweeper"}


def _states(synth) -> dict:
    _, sm = _state_machine(synth)
    return json.loads(sm["Properties"]["DefinitionString"])["States"]


def test_a_wait_without_a_signal_checks_the_batch_and_waits_again(synth):
    """The reconciling wait (docs/lifecycle.md, "Lost signals"): a timeout is a check, not an
    expiry; a check that finds nothing to act on waits again (a fresh token), else drains."""
    states = _states(synth)
    wait = states["WaitForSignal"]
    assert wait["TimeoutSecondsPath"] == "$.timeout_seconds"
    (timeout,) = [c for c in wait["Catch"] if c["ErrorEquals"] == ["States.Timeout"]]
    assert timeout["Next"] == "Check"
    check = states["Check"]
    assert check["Parameters"]["Payload"]["action"] == "check"
    assert check["Parameters"]["Payload"]["reconcile_seconds.$"] == "$.reconcile_seconds"
    choice = states[check["Next"]]
    (again,) = choice["Choices"]
    assert (again["Variable"], again["StringEquals"], choice["Default"]) == ("$.signal.outcome", "wait", "Drain")
    rearm = states[again["Next"]]
    assert rearm["Next"] == "WaitForSignal" and rearm["ResultPath"] == "$.timeout_seconds"


def test_tasks_retry_transient_failures_before_the_failure_path(synth):
    states = _states(synth)
    for name in ("WaitForSignal", "Check", "Drain", "Finalize"):
        retried = {e for r in states[name]["Retry"] for e in r["ErrorEquals"]}
        assert retried & {"States.ALL", "States.TaskFailed"}, name  # any task failure, not only Lambda's
        assert "Lambda.ServiceException" in retried and "Lambda.TooManyRequestsException" in retried, name
        assert all(r["MaxAttempts"] >= 2 and r["BackoffRate"] >= 1 for r in states[name]["Retry"]), name
    # on the wait, a timeout is the reconcile tick: no retrier may swallow it before its Catch
    assert all(
        "States.ALL" not in r["ErrorEquals"] and "States.Timeout" not in r["ErrorEquals"]
        for r in states["WaitForSignal"]["Retry"]
    )


def test_the_failure_path_comes_after_retries_and_is_retried_itself():
    """docs/reliability.md, "Nothing completed is lost": every Catch leads to Fail, only from a
    task that retries any task failure first; Fail gets the caught error and is retried itself
    (it assembles the batch's files, which can meet the same transient faults)."""
    states = workflow.definition()["States"]
    catching = {name: state for name, state in states.items() if state.get("Catch")}
    assert set(catching) == {"WaitForSignal", "Check", "Drain", "Finalize"}
    for name, state in catching.items():
        to_fail = [c for c in state["Catch"] if c["Next"] == "Fail"]
        assert [c["ErrorEquals"] for c in to_fail] == [["States.ALL"]] and to_fail[0]["ResultPath"] == "$.error", name
        retried = {e for r in state["Retry"] for e in r["ErrorEquals"]}
        assert retried & {"States.ALL", "States.TaskFailed"}, name
    fail = states["Fail"]
    assert fail["Parameters"]["Payload"]["action"] == "fail" and fail["Parameters"]["Payload"]["error.$"] == "$.error"
    retried = {e for r in fail["Retry"] for e in r["ErrorEquals"]}
    assert "States.ALL" in retried and "Lambda.ServiceException" in retried
    assert all(r["MaxAttempts"] >= 2 for r in fail["Retry"])
    assert states[fail["Next"]]["Type"] == "Fail"  # the execution shows it failed
