"""The batch lifecycle's random transition sequences (tests/unit/test_lifecycle.py) against the
DynamoDB adapter on moto: the same rules hold where the conditions are DynamoDB's expressions and
the reservation's release a transaction (fewer examples: each step is a few moto calls)."""

import uuid

from hypothesis import HealthCheck, given, settings

from functions.core.ports import Stores
from tests.unit.test_lifecycle import STEPS, walk


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_random_transition_sequences_keep_the_lifecycle_rules_on_dynamodb(stores: Stores, steps):
    tenant = f"t{uuid.uuid4().hex[:12]}"  # the moto table is the test's: a tenant of its own per example
    walk(stores, steps, ["b0", "b1", "b2"], tenant=tenant)
