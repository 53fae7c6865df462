"""cdk-nag (AwsSolutions) and cfn-lint on the synthesized template."""

import json

from cfnlint.api import ManualArgs, lint_file

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
    report = json.loads((synth.outdir / "validation-report.json").read_text()) if (synth.outdir / "validation-report.json").exists() else {}
    for plugin in report.get("pluginReports", []):
        assert plugin.get("summary", {}).get("status", "success") == "success", plugin


def test_cfn_lint_is_clean(synth):
    matches = lint_file(synth.template_path, config=ManualArgs(ignore_checks=list(CFN_LINT_IGNORED)))
    assert not matches, "\n".join(str(m) for m in matches)
