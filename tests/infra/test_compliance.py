"""cdk-nag (AwsSolutions) and cfn-lint on the synthesized template."""

import json

import pytest
from aws_cdk import aws_sqs as sqs
from cfnlint.api import ManualArgs, lint_file

from infra.app import build

#: cfn-lint checks ignored, each with its reason.
CFN_LINT_IGNORED = {
    # CDK's Function adds DependsOn on its role next to the Fn::GetAtt of the same role; redundant,
    # harmless, and not something the L2 construct lets us turn off.
    "W3005": "redundant DependsOn that CDK's lambda.Function emits",
}


def test_cdk_nag_ran_and_every_acknowledgment_has_a_reason(synth):
    # The session synth raised if cdk-nag had any unacknowledged finding; the plugin writes what was
    # acknowledged into each resource's metadata, which also proves it ran.
    acknowledged = {}
    for logical_id, resource in synth.json["Resources"].items():
        for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
            # cdk-nag's rules, and CDK's own acknowledgment of its built-in template validation
            # (the flow log's DestinationOptions casing).
            assert rule["id"].startswith(("AwsSolutions-", "CloudFormation-Validate::")), rule
            assert len(rule["reason"]) > 30, rule
            acknowledged.setdefault(rule["id"], set()).add(logical_id)
    assert acknowledged, "cdk-nag did not run (no acknowledgments recorded)"
    # Acknowledgments stay few and targeted: no blanket stack-level suppressions.
    assert all(len(ids) < len(synth.json["Resources"]) / 2 for ids in acknowledged.values())


def test_validation_report_is_written_and_every_plugin_passed(synth):
    # CDK writes this report when it runs validation plugins (cdk-nag here); no report is a failure.
    path = synth.outdir / "validation-report.json"
    assert path.exists(), "no validation report"
    report = json.loads(path.read_text())
    assert report["title"] == "Validation Report"
    assert all(plugin["conclusion"] == "success" for plugin in report["pluginReports"]), report


def test_a_finding_fails_the_synth_and_is_in_the_report(tmp_path):
    """The app as ``cdk synth`` builds it, plus one queue that breaks two AwsSolutions rules (no DLQ,
    no SSL-only policy): the synth fails and its report names the rules and the construct. This is
    what makes the session synth's success mean something."""
    app, stack = build(outdir=str(tmp_path))
    sqs.Queue(stack, "Unsafe")
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    (plugin,) = report["pluginReports"]
    assert (plugin["pluginName"], plugin["conclusion"]) == ("AwsSolutions", "failure")
    found = {(v["ruleName"], c["constructPath"]) for v in plugin["violations"] for c in v["violatingConstructs"]}
    assert found == {
        ("AwsSolutions-SQS3", "BatchApi/Unsafe/Resource"),
        ("AwsSolutions-SQS4", "BatchApi/Unsafe/Resource"),
    }


def test_cfn_lint_is_clean(synth):
    matches = lint_file(synth.template_path, config=ManualArgs(ignore_checks=list(CFN_LINT_IGNORED)))
    assert not matches, "\n".join(str(m) for m in matches)
