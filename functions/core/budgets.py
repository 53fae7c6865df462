"""Token budgets: what a tenant may spend per period, what it has spent, and where that is kept
(one budget item per tenant and calendar period, ``schema.budget_pk``/``budget_sk``). The
policy's fields are ``tenants.TenantPolicy``'s; this module is what records, messages and the
stores share."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict

#: The budget item's attribute of each kind of token it is charged with (``BudgetCaps`` names them too).
BUDGET_KINDS: tuple[str, ...] = ("output_tokens", "input_tokens")


class BudgetCaps(BaseModel):
    """A tenant's token budgets for one period (None: that kind is not budgeted)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    output_tokens: int | None = None
    input_tokens: int | None = None

    def reached(self, spent: Spent) -> str | None:
        """The first kind of token whose budget ``spent`` has reached (None: both still have room)."""
        for kind in BUDGET_KINDS:
            cap = getattr(self, kind)
            if cap is not None and getattr(spent, kind) >= cap:
                return kind
        return None

    def describe(self, kind: str, period: str) -> str:
        what = "output" if kind == "output_tokens" else "input"
        return f"{what}-token budget ({getattr(self, kind)} tokens per {period})"


#: What counting one chunk adds to its tenant's budget: the budget item's sort key (``budget_sk``)
#: and the tokens by kind (``ChunkRecord.budget_charge``).
Charge = tuple[str, dict[str, int]]


class Spent(BaseModel):
    """What a tenant's budget item of one period has been charged (``BatchStore.budget_used``)."""

    model_config = ConfigDict(frozen=True)

    output_tokens: int = 0
    input_tokens: int = 0


def budget_sk(period: str, now: int) -> str:
    """The budget item of the ``period`` ("day"/"month") holding ``now`` (UTC calendar periods)."""
    stamp = datetime.fromtimestamp(now, tz=UTC)
    return stamp.strftime("DAY#%Y-%m-%d") if period == "day" else stamp.strftime("MONTH#%Y-%m")
