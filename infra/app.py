"""The CDK app (``cdk.json``: ``python -m infra.app``): one stack, cdk-nag AwsSolutions on.

Synth makes no AWS calls: the stack is environment-agnostic unless the config pins an account and
region, and nothing looks anything up. The config comes from CDK context (see infra/config.py).
"""

from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from infra import config as deploy_config
from infra import names
from infra.stack import BatchApiStack

#: Feature flags this app relies on, as defaults (cdk.json or -c still win). They are here, not in
#: cdk.json, so the tests (which build the app in-process, without the CLI) synthesize the same.
FEATURE_FLAGS: dict[str, Any] = {
    # Server access logs delivered through a bucket policy for logging.s3.amazonaws.com, not ACLs.
    "@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy": True,
    "@aws-cdk/aws-s3:createDefaultLoggingPolicy": True,
    # Merge statements of generated IAM policies (smaller policies, same permissions).
    "@aws-cdk/aws-iam:minimizePolicies": True,
    # API Gateway's account logging role is created explicitly (Api construct), never implicitly.
    "@aws-cdk/aws-apigateway:disableCloudWatchRole": True,
    "@aws-cdk/core:enablePartitionLiterals": True,
}


def build(context: dict[str, Any] | None = None, *, outdir: str | None = None) -> tuple[cdk.App, BatchApiStack]:
    """The app and its stack, as ``cdk synth`` builds them (tests call this with their context)."""
    app = cdk.App(context={**FEATURE_FLAGS, **(context or {})}, outdir=outdir)
    config = deploy_config.from_context(app.node)
    env = cdk.Environment(account=config.account, region=config.region) if config.account else None
    stack = BatchApiStack(app, names.STACK_NAME, config=config, env=env)
    for key, value in config.tags.items():
        cdk.Tags.of(stack).add(key, value)
    # Findings fail the synth; acknowledged ones (each with its reason) are also written into the
    # template's resource Metadata (cdk_nag.rules_to_suppress) as an audit trail.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app, write_suppressions_to_cloud_formation=True))
    return app, stack


def main() -> None:
    app, _ = build()
    app.synth()


if __name__ == "__main__":
    main()
