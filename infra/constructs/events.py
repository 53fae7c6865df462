"""The deployment's own event bus for the batch lifecycle events (source ``batch-api``,
detail-type ``batch.<status>``; docs/webhooks.md "Who may publish", docs/deploy.md "Batch events").

Its resource policy denies ``events:PutEvents`` to every principal except the roles the stack
gave ``grant_publish`` (ingest, the ingest DLQ consumer, the workflow, the sweeper), whatever the
principal's own IAM policies allow: an explicit Deny in a resource-based policy overrides any
Allow, for principals of the same account too (IAM "Policy evaluation logic",
https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html). For
a role's session ``aws:PrincipalArn`` is the role's ARN (IAM "AWS global condition context keys").
Rules on the bus (the webhook fan-out, the batch events log) are the stack's consumers; an
operator's own rules may be added beside them.
"""

from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra import names

from .common import resource_prefix

PUT_EVENTS = "events:PutEvents"
#: The bus policy's one statement (its ``Sid``): PutEvents denied to all but the publishers.
ONLY_PUBLISHERS_SID = "OnlyTheStacksPublishers"


class BatchEvents(Construct):
    """``bus``, ``grant_publish`` for each publisher, then ``seal`` (once, when all are granted)
    writes the policy; ``publishers`` are the roles it admits."""

    def __init__(self, scope: Construct, id: str) -> None:
        super().__init__(scope, id)
        self.publishers: list[iam.IRole] = []
        self._sealed = False
        self.bus = events.EventBus(
            self,
            "Bus",
            event_bus_name=names.event_bus_name(resource_prefix(self)),
            description="Batch lifecycle events (source batch-api); only the stack's publishers may put events",
        )

    def grant_publish(self, function: lambda_.IFunction) -> iam.Grant:
        """``function`` may put events on the bus: IAM allows it, and the bus policy admits its role."""
        if self._sealed:
            raise ValueError("the batch event bus's policy is written: grant publishers before seal()")
        role = function.role
        if role is None:
            raise ValueError(f"{function.node.path} has no role to admit")
        self.publishers.append(role)
        return self.bus.grant_put_events_to(function)

    def seal(self) -> None:
        """The bus policy: one Deny of PutEvents for every principal whose ARN is none of the
        publishers' roles (one statement: two would each deny the other's publishers)."""
        if not self.publishers:
            raise ValueError("the batch event bus has no publisher: its policy would deny everyone")
        self._sealed = True
        self.bus.add_to_resource_policy(
            iam.PolicyStatement(
                sid=ONLY_PUBLISHERS_SID,
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=[PUT_EVENTS],
                resources=[self.bus.event_bus_arn],
                conditions={"ArnNotEquals": {"aws:PrincipalArn": [role.role_arn for role in self.publishers]}},
            )
        )
