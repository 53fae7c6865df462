"""Small helpers every construct uses: removal policy, log groups, cdk-nag acknowledgments."""

from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import DeployConfig


def removal_policy(config: DeployConfig) -> cdk.RemovalPolicy:
    return cdk.RemovalPolicy.DESTROY if config.removal_policy == "destroy" else cdk.RemovalPolicy.RETAIN


def log_group(scope: Construct, id: str, config: DeployConfig) -> logs.LogGroup:
    """A log group with the deployment's retention and removal policy."""
    group = logs.LogGroup(scope, id, removal_policy=removal_policy(config))
    # RetentionDays is a string enum in Python; CloudFormation wants the number of days, which the
    # config has already validated against the values CloudWatch accepts.
    cast(logs.CfnLogGroup, group.node.default_child).retention_in_days = config.log_retention_days
    return group


def acknowledge(scope: Construct, rule: str, reason: str) -> None:
    """Acknowledge (suppress) one cdk-nag finding on ``scope`` and its children, with the reason.

    cdk-nag 3 has no prefix matching: an IAM5 finding is acknowledged with its full id, e.g.
    ``AwsSolutions-IAM5[Resource::*]``."""
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=rule, reason=reason))


def arn_in_findings(resource: Construct) -> str:
    """How cdk-nag writes ``resource``'s ARN in an IAM5 finding id: ``<LogicalId.Arn>``."""
    cfn = resource.node.default_child if not isinstance(resource, cdk.CfnElement) else resource
    stack = cdk.Stack.of(resource)
    return f"<{stack.resolve(stack.get_logical_id(cast(cdk.CfnElement, cfn)))}.Arn>"


def acknowledge_wildcards(scope: Construct, findings: dict[str, str]) -> None:
    """Acknowledge IAM5 wildcard findings on ``scope``: ``{"Action::s3:GetObject*": reason, ...}``."""
    for finding, reason in findings.items():
        acknowledge(scope, f"AwsSolutions-IAM5[{finding}]", reason)
