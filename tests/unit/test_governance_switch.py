"""The governance switch (docs/governance.md, "The switch") at the composition root: ``Settings.governance`` off
builds the stores with the no-op policy store, so no policy is read and no rule applies."""

from unittest import mock

import pytest

from functions.core import aws
from functions.core.aws import NoPolicy, stores_from_settings
from functions.core.aws.tenants import TenantRepo
from functions.core.errors import RateLimited
from functions.core.settings import Settings
from functions.core.tenants import TenantPolicy, admit_creation
from tests.fakes.aws import fake_stores


def settings(**values) -> Settings:
    return Settings(table_name="t", bucket_name="b", **values)


def test_the_switch_is_one_setting_on_by_default_and_read_from_its_env_var() -> None:
    assert settings().governance is True
    assert (
        Settings.from_env(
            {"BATCHAPI_TABLE_NAME": "t", "BATCHAPI_BUCKET_NAME": "b", "BATCHAPI_GOVERNANCE": "false"}
        ).governance
        is False
    )
    assert settings(governance=False).to_env()["BATCHAPI_GOVERNANCE"] == "false"


@pytest.mark.parametrize("on, store", [(True, TenantRepo), (False, NoPolicy)])
def test_stores_get_the_policy_store_the_switch_says(on: bool, store: type) -> None:
    with mock.patch.object(aws.clients, "client"), mock.patch.object(aws.clients, "dynamodb_table"):
        stores = stores_from_settings(settings(governance=on))
    assert type(stores.tenants) is store
    assert (stores.audit_log is not None) is on  # off: no audit chain is kept


def test_with_governance_off_no_rule_applies() -> None:
    """A tenant whose (would-be) policy allows no creation at all is admitted: no policy is read."""
    store = NoPolicy()
    assert store.get("acme") is None and store.list() == []
    for _ in range(3):
        assert admit_creation(store, "acme", now=1_000) is None
    with pytest.raises(RuntimeError):
        store.put(TenantPolicy(tenant="acme", batches_per_hour=0))


def test_with_governance_on_the_policy_applies() -> None:
    stores = fake_stores()
    stores.tenants.put(TenantPolicy(tenant="acme", batches_per_hour=0))
    with pytest.raises(RateLimited):
        admit_creation(stores.tenants, "acme", now=1_000)
