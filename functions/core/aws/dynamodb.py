"""DynamoDB: a thin adapter over a boto3 ``Table`` resource speaking in items, and the conditional
write operations (``Put``, ``Update``) compiled to DynamoDB expressions. The repositories built on
it are in ``repos``."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from boto3.dynamodb.conditions import Attr, ConditionExpressionBuilder, Key

from .. import schema
from ..errors import Throttled
from .errors import translate

T = TypeVar("T")

#: Attempts of one call (the first included) when DynamoDB answers with a transaction conflict or
#: a throttling that botocore's own retries gave up on; between attempts a full-jitter exponential
#: backoff: a random wait in [0, min(BACKOFF_CAP, BACKOFF_BASE * 2**(n-1))) after the n-th attempt.
#: Documented in docs/reliability.md ("Transient AWS errors").
ATTEMPTS = 6
BACKOFF_BASE_SECONDS = 0.025
BACKOFF_CAP_SECONDS = 1.0


class Table:
    """A thin adapter over a boto3 ``Table`` resource speaking in items.

    Every call is retried where the fault occurs when DynamoDB says the request was not applied
    because the item is busy: ``TransactionConflictException``, a ``TransactionCanceledException``
    whose reasons say ``TransactionConflict`` (or throttling), and throttling codes botocore gave
    up on. ``attempts`` calls at most, with a jittered exponential ``sleep`` between them; then
    ``TransactionConflict`` / ``Throttled``. A cancelled transaction with a
    ``ConditionalCheckFailed`` reason raises ``ConditionFailed`` at once (never retried)."""

    def __init__(
        self,
        table: Any = None,
        *,
        per_thread: Callable[[], Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        attempts: int = ATTEMPTS,
        backoff_base: float = BACKOFF_BASE_SECONDS,
        backoff_cap: float = BACKOFF_CAP_SECONDS,
        jitter: Callable[[], float] = random.random,
    ):
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        if (table is None) == (per_thread is None):
            raise ValueError("give the table resource, or per_thread: a function returning this thread's")
        self._resource, self._per_thread = table, per_thread
        self._sleep, self._attempts, self._jitter = sleep, attempts, jitter
        self._backoff_base, self._backoff_cap = backoff_base, backoff_cap

    def prepare(self) -> None:
        """Make this thread's resource now (``per_thread``; no network): not on a first call."""
        self._table  # noqa: B018 - the property makes it

    @property
    def _table(self) -> Any:
        """The boto3 ``Table`` resource: the one given, or this thread's (``per_thread``)."""
        return self._resource if self._per_thread is None else self._per_thread()

    def _call(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """``fn(**kwargs)`` with AWS errors translated, retried while DynamoDB is busy."""
        attempt = 1
        while True:
            try:
                with translate():
                    return fn(**kwargs)
            except Throttled:  # TransactionConflict included; ConditionFailed is not one
                if attempt >= self._attempts:
                    raise
                self._sleep(self._jitter() * min(self._backoff_cap, self._backoff_base * 2 ** (attempt - 1)))
                attempt += 1

    def put(self, item: dict[str, Any], *, if_absent: bool = False) -> None:
        kwargs: dict[str, Any] = {"Item": item}
        if if_absent:
            kwargs["ConditionExpression"] = Attr(schema.PK).not_exists()
        self._call(self._table.put_item, **kwargs)

    def get(self, pk: str, sk: str) -> dict[str, Any] | None:
        return self._call(self._table.get_item, Key={schema.PK: pk, schema.SK: sk}, ConsistentRead=True).get("Item")

    def delete(self, pk: str, sk: str) -> dict[str, Any] | None:
        """Delete and return the old item (None if there was none)."""
        resp = self._call(self._table.delete_item, Key={schema.PK: pk, schema.SK: sk}, ReturnValues="ALL_OLD")
        return resp.get("Attributes")

    def update(self, op: Update) -> dict[str, Any]:
        """Apply one conditional update; returns the new item (ConditionFailed if it does not hold)."""
        request = op.render(self._table.name)["Update"]
        del request["TableName"]
        return self._call(self._table.update_item, **request, ReturnValues="ALL_NEW")["Attributes"]

    def add_below(self, pk: str, sk: str, attribute: str, limit: int, values: dict[str, Any]) -> dict[str, Any]:
        """ADD 1 to the number ``attribute`` (creating the item) and SET ``values``, only while the
        number is absent or below ``limit``; returns the new item (ConditionFailed at the limit)."""
        names = {"#n": attribute, **{f"#v{i}": k for i, k in enumerate(values)}}
        bound = {":one": 1, ":limit": limit, **{f":v{i}": v for i, v in enumerate(values.values())}}
        sets = ", ".join(f"#v{i} = :v{i}" for i in range(len(values)))
        return self._call(
            self._table.update_item,
            Key={schema.PK: pk, schema.SK: sk},
            UpdateExpression="ADD #n :one" + (f" SET {sets}" if sets else ""),
            ConditionExpression="attribute_not_exists(#n) OR #n < :limit",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=bound,
            ReturnValues="ALL_NEW",
        )["Attributes"]

    def set_if(self, pk: str, sk: str, values: dict[str, Any], *, expect: dict[str, Any]) -> dict[str, Any]:
        """Set attributes only if the item exists and matches ``expect``; returns the new item."""
        return self.update(Update(pk, sk, values=values, expect=expect))

    def query_page(
        self,
        *,
        pk: str,
        prefix: str,
        after: str | None,
        ascending: bool,
        limit: int,
        keep: Callable[[dict[str, Any]], bool] = lambda _: True,
        index: str | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """Up to ``limit`` items of partition ``pk`` whose sort key starts with ``prefix``, in sort
        key order, strictly after the sort key ``prefix + after``. Returns (items, has_more).
        Items for which ``keep`` is false (e.g. expired, awaiting TTL) are skipped."""
        pk_name, sk_name = (schema.GSI_PURPOSE_PK, schema.GSI_PURPOSE_SK) if index else (schema.PK, schema.SK)
        condition = Key(pk_name).eq(pk)
        if after is None:
            if prefix:
                condition &= Key(sk_name).begins_with(prefix)
        elif ascending:
            condition &= Key(sk_name).gt(prefix + after)
        else:
            condition &= Key(sk_name).lt(prefix + after)
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": condition,
            "ScanIndexForward": ascending,
            "Limit": min(limit + 1, 1000),
        }
        if index:
            kwargs["IndexName"] = index
        else:
            kwargs["ConsistentRead"] = True
        out: list[dict[str, Any]] = []
        while True:
            resp = self._call(self._table.query, **kwargs)
            for item in resp["Items"]:
                if not item[sk_name].startswith(prefix):
                    return out, False
                if keep(item):
                    if len(out) == limit:
                        return out, True
                    out.append(item)
            if "LastEvaluatedKey" not in resp:
                return out, False
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def query_index(self, index: str, pk_name: str, pk: str) -> list[dict[str, Any]]:
        """Every item (as the index projects it) of partition ``pk`` of the GSI ``index``, in sort
        key order (all pages)."""
        return self._all_pages(self._table.query, IndexName=index, KeyConditionExpression=Key(pk_name).eq(pk))

    def scan_prefix(self, pk_prefix: str) -> list[dict[str, Any]]:
        """Every item whose partition key starts with ``pk_prefix`` (all pages). A Scan reads the
        whole table: for one-off operator commands only (``batchctl keys backfill``), never a
        request path."""
        return self._all_pages(
            self._table.scan, FilterExpression=Attr(schema.PK).begins_with(pk_prefix), ConsistentRead=True
        )

    def _all_pages(self, operation: Callable[..., dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
        """Every item of a Query or Scan, page after page (``LastEvaluatedKey``)."""
        out: list[dict[str, Any]] = []
        while True:
            resp = self._call(operation, **kwargs)
            out.extend(resp["Items"])
            if "LastEvaluatedKey" not in resp:
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def batch_get(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """Items for the given (pk, sk) keys, in no particular order (missing ones left out)."""
        out: list[dict[str, Any]] = []
        for start in range(0, len(keys), 100):
            request = {
                self._table.name: {
                    "Keys": [{schema.PK: pk, schema.SK: sk} for pk, sk in keys[start : start + 100]],
                    "ConsistentRead": True,
                }
            }
            while request:
                resp = self._call(self._table.meta.client.batch_get_item, RequestItems=request)
                out.extend(resp["Responses"].get(self._table.name, []))
                request = resp.get("UnprocessedKeys") or {}
        return out

    def transact(self, ops: list[Any]) -> None:
        """Apply all ``ops`` atomically; ConditionFailed if any condition does not hold.
        (The resource's client serializes native values, as for every other call here.) A
        cancelled transaction applied nothing, so retrying one that conflicted is safe."""
        items = [op.render(self._table.name) for op in ops]
        self._call(self._table.meta.client.transact_write_items, TransactItems=items)


def _render(condition: Any, names: dict[str, str], values: dict[str, Any]) -> str:
    built = ConditionExpressionBuilder().build_expression(condition)
    names.update(built.attribute_name_placeholders)
    values.update(built.attribute_value_placeholders)
    return built.condition_expression


@dataclass(frozen=True)
class Put:
    """A transactional put; ``if_absent`` makes it fail when the item exists."""

    item: dict[str, Any]
    if_absent: bool = False

    def render(self, table: str) -> dict[str, Any]:
        body: dict[str, Any] = {"TableName": table, "Item": self.item}
        if self.if_absent:
            names: dict[str, str] = {}
            values: dict[str, Any] = {}
            body["ConditionExpression"] = _render(Attr(schema.PK).not_exists(), names, values)
            body["ExpressionAttributeNames"] = names
        return {"Put": body}


@dataclass(frozen=True)
class Delete:
    """A transactional delete; with ``condition`` (a boto3 ``Attr`` condition) only if it holds."""

    pk: str
    sk: str
    condition: Any = None

    def render(self, table: str) -> dict[str, Any]:
        body: dict[str, Any] = {"TableName": table, "Key": {schema.PK: self.pk, schema.SK: self.sk}}
        if self.condition is not None:
            names: dict[str, str] = {}
            values: dict[str, Any] = {}
            body["ConditionExpression"] = _render(self.condition, names, values)
            body["ExpressionAttributeNames"] = names
            if values:
                body["ExpressionAttributeValues"] = values
        return {"Delete": body}


@dataclass(frozen=True)
class Check:
    """A transactional ConditionCheck: ``condition`` (a boto3 ``Attr`` condition) must hold on the
    item, which need not exist (an absent item has no attributes)."""

    pk: str
    sk: str
    condition: Any

    def render(self, table: str) -> dict[str, Any]:
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        body: dict[str, Any] = {
            "TableName": table,
            "Key": {schema.PK: self.pk, schema.SK: self.sk},
            "ConditionExpression": _render(self.condition, names, values),
            "ExpressionAttributeNames": names,
        }
        if values:
            body["ExpressionAttributeValues"] = values
        return {"ConditionCheck": body}


def _expect(expect: dict[str, Any]) -> Any:
    """The item exists and each attribute equals its value (a tuple: is one of its values;
    None: is absent)."""
    condition = Attr(schema.PK).exists()
    for k, v in expect.items():
        if v is None:
            condition &= Attr(k).not_exists()
        elif isinstance(v, tuple):
            condition &= Attr(k).is_in(list(v))
        else:
            condition &= Attr(k).eq(v)
    return condition


@dataclass(frozen=True)
class Add:
    """A transactional ADD of numbers to an item that may not exist yet (no condition: ``Update``
    requires the item to exist)."""

    pk: str
    sk: str
    add: dict[str, int]

    def render(self, table: str) -> dict[str, Any]:
        names = {f"#a{i}": k for i, k in enumerate(self.add)}
        values = {f":a{i}": v for i, v in enumerate(self.add.values())}
        return {
            "Update": {
                "TableName": table,
                "Key": {schema.PK: self.pk, schema.SK: self.sk},
                "UpdateExpression": "ADD " + ", ".join(f"#a{i} :a{i}" for i in range(len(self.add))),
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
        }


@dataclass(frozen=True)
class Update:
    """A conditional update: SET ``values``, SET ``defaults`` only where absent, ADD ``add``
    (numbers or sets), REMOVE ``remove``; only if the item exists and matches ``expect``."""

    pk: str
    sk: str
    values: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    add: dict[str, Any] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    expect: dict[str, Any] = field(default_factory=dict)

    def render(self, table: str) -> dict[str, Any]:
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        sets, adds, removes = [], [], []
        for i, (k, v) in enumerate(self.values.items()):
            names[f"#u{i}"], values[f":u{i}"] = k, v
            sets.append(f"#u{i} = :u{i}")
        for i, (k, v) in enumerate(self.defaults.items()):
            names[f"#d{i}"], values[f":d{i}"] = k, v
            sets.append(f"#d{i} = if_not_exists(#d{i}, :d{i})")
        for i, (k, v) in enumerate(self.add.items()):
            names[f"#a{i}"], values[f":a{i}"] = k, v
            adds.append(f"#a{i} :a{i}")
        for i, k in enumerate(self.remove):
            names[f"#r{i}"] = k
            removes.append(f"#r{i}")
        clauses = [
            f"{verb} {', '.join(parts)}" for verb, parts in (("SET", sets), ("ADD", adds), ("REMOVE", removes)) if parts
        ]
        expression = _render(_expect(self.expect), names, values)
        request: dict[str, Any] = {
            "TableName": table,
            "Key": {schema.PK: self.pk, schema.SK: self.sk},
            "UpdateExpression": " ".join(clauses),
            "ConditionExpression": expression,
            "ExpressionAttributeNames": names,
        }
        if values:
            request["ExpressionAttributeValues"] = values
        return {"Update": request}
