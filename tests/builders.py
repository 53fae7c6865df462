"""Test builders: records and stored state the tests set up directly, in one place."""

from typing import Any

from functions.core.lifecycle import Change
from functions.core.ports import Stores
from functions.core.records import BatchRecord


def set_batch(stores: Stores, tenant: str, batch_id: str, **values: Any) -> BatchRecord:
    """Set attributes of a stored batch as they are, with no lifecycle rule and no condition (an
    operator's direct write): on the in-memory fake without counting a call, on AWS as one write."""
    setter = getattr(stores.batches, "set", None)
    if setter is not None:
        return setter(tenant, batch_id, **values)
    return stores.batches.transition(tenant, batch_id, Change(values=values))
