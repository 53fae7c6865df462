"""DynamoDB's per-partition throughput limits on moto, which has none.

What AWS documents (DynamoDB Developer Guide, "Partitions and data distribution" and "Burst and
adaptive capacity", https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/HowItWorks.Partitions.html,
https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/burst-adaptive-capacity.html):
one partition serves at most **3,000 read units and 1,000 write units a second**, whatever the
table's mode (on-demand included); adaptive capacity can move a hot item to a partition of its
own, but never splits one item, and can split an item collection (one partition key) by sort key
only over time. Units ("Read/write capacity mode", .../read-write-operations.html): a strongly
consistent read costs 1 unit per 4 KB of the item (an absent item 1), a write 1 unit per 1 KB of
the larger of the item before and after (a failed condition still costs it), a transactional read
or write twice that.

``PartitionLimits`` meters every request of one table's client by those rules, on a clock the test
moves (``now``, seconds), and enforces them with no kindness AWS would not show: the limit holds
for each partition key (an item collection is never split by heat, as it may be after a while on
AWS), each second on its own (no burst credit), a Query is charged every item of its partition
(not only those it returns), and a request that takes a partition past a limit in a second is an
``Excess``: recorded and raised (``PartitionLimitExceeded``), so the code under test cannot go on as
if DynamoDB had taken it.

Item sizes are moto's (``Item.size()``: attribute names and values, DynamoDB's rule), read from its
in-process backend before and after each request; so the meter runs with moto in decorator mode
(``mock_aws``), on one thread.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.models.dynamo_type import DynamoType

from tests.dynamodb_requests import Touch, touches

READ_UNITS_PER_SECOND = 3_000
WRITE_UNITS_PER_SECOND = 1_000
READ_UNIT_BYTES = 4 * 1024
WRITE_UNIT_BYTES = 1024


class PartitionLimitExceeded(Exception):
    """A request took a partition past DynamoDB's per-partition limit (what AWS would throttle)."""


@dataclass(frozen=True)
class Excess:
    pk: str
    second: int
    kind: str
    units: float

    def __str__(self) -> str:
        limit = WRITE_UNITS_PER_SECOND if self.kind == "write" else READ_UNITS_PER_SECOND
        return f"{self.units:g} {self.kind} units in second {self.second} on partition {self.pk} (limit {limit})"


@dataclass
class PartitionLimits:
    table_name: str
    region: str = "us-east-1"
    #: The clock the test moves: the second a request is charged to.
    now: float = 0.0
    #: Units used: (partition key, second, "read" | "write") -> units.
    used: dict[tuple[str, int, str], float] = field(default_factory=lambda: defaultdict(float))
    excess: list[Excess] = field(default_factory=list)
    #: Requests by operation, and by partition.
    operations: Counter[str] = field(default_factory=Counter)
    by_partition: Counter[str] = field(default_factory=Counter)

    def install(self, client: Any) -> PartitionLimits:
        """Meter every request ``client`` (a DynamoDB client) makes from now on."""
        client.meta.events.register("provide-client-params.dynamodb.*", self._before)
        client.meta.events.register("after-call.dynamodb.*", self._after)
        return self

    # --- the rules -------------------------------------------------------------------------
    def _table(self) -> Any:
        return dynamodb_backends[DEFAULT_ACCOUNT_ID][self.region].get_table(self.table_name)

    def _size(self, touch: Touch) -> int:
        """The stored size of the item (a Query: of every item of its partition)."""
        items = self._table().items.get(DynamoType({"S": touch.pk}), {})
        if touch.sk is None:
            return sum(item.size() for item in items.values())
        item = items.get(DynamoType({"S": touch.sk}))
        return item.size() if item is not None else 0

    @staticmethod
    def units(touch: Touch, before: int, after: int) -> float:
        """What one item of a request costs (docs above)."""
        size, unit = (max(before, after), WRITE_UNIT_BYTES) if touch.writes else (before, READ_UNIT_BYTES)
        return max(1, math.ceil(size / unit)) * (2 if touch.transactional else 1)

    # --- the hooks -------------------------------------------------------------------------
    def _before(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        found = touches(model.name, params)
        context["partition_limits"] = [(t, self._size(t)) for t in found]
        self.operations[model.name] += 1

    def _after(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        second = int(self.now)
        over: list[Excess] = []
        for touch, before in context.pop("partition_limits", []):
            after = self._size(touch) if touch.writes else before
            kind = "write" if touch.writes else "read"
            key = (touch.pk, second, kind)
            self.used[key] += self.units(touch, before, after)
            self.by_partition[touch.pk] += 1
            limit = WRITE_UNITS_PER_SECOND if touch.writes else READ_UNITS_PER_SECOND
            if self.used[key] > limit:
                over.append(Excess(touch.pk, second, kind, self.used[key]))
        if over:
            self.excess.extend(over)
            raise PartitionLimitExceeded("; ".join(str(e) for e in over))

    # --- what the test reads -----------------------------------------------------------------
    def peak(self, kind: str) -> tuple[float, str, int]:
        """The most units of ``kind`` one partition used in one second: (units, partition, second)."""
        best = max(((u, pk, s) for (pk, s, k), u in self.used.items() if k == kind), default=(0.0, "", 0))
        return best

    def peak_of(self, kind: str, pk: str) -> float:
        """The most units of ``kind`` partition ``pk`` used in one second."""
        return max((u for (p, _, k), u in self.used.items() if k == kind and p == pk), default=0.0)
