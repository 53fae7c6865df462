"""A Query of the local moto lists only what it may return (infra/local/moto_query.py): the same
answers as moto's (order, key conditions, paging, projections, indexes), without listing the table."""

import boto3
import pytest
from boto3.dynamodb.conditions import Key
from moto import mock_aws
from moto.dynamodb.models.table import Table

from functions.core import schema
from infra.local import moto_query


@pytest.fixture
def table():
    moto_query.install()
    with mock_aws():
        ddb = boto3.resource("dynamodb", region_name="us-east-1")
        created = ddb.create_table(TableName="t", **schema.TABLE_SCHEMA)
        with created.batch_writer() as writer:
            for p in range(20):
                for s in range(30):
                    item = {schema.PK: f"P#{p:02d}", schema.SK: f"S#{s:03d}", "n": s, "pad": "x" * (s % 7)}
                    if s % 3 == 0:  # a sparse index: a third of the items
                        item |= {schema.GSI_PURPOSE_PK: f"G#{s % 2}", schema.GSI_PURPOSE_SK: f"{p:02d}-{s:03d}"}
                    writer.put_item(Item=item)
        yield created


def _pages(table, **kwargs):
    keys, pages = [], 0
    while True:
        resp = table.query(**kwargs)
        keys += [(i[schema.PK], i[schema.SK]) for i in resp["Items"]]
        pages += 1
        if "LastEvaluatedKey" not in resp:
            return keys, pages
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def test_a_base_table_query_answers_as_moto_without_listing_the_table(table, monkeypatch):
    listed: list[int] = []
    all_items = Table.all_items
    monkeypatch.setattr(Table, "all_items", lambda t: listed.append(len(items := all_items(t))) or items)
    p = Key(schema.PK).eq("P#07")
    assert _pages(table, KeyConditionExpression=p) == ([("P#07", f"S#{s:03d}") for s in range(30)], 1)
    assert _pages(table, KeyConditionExpression=p, ScanIndexForward=False, Limit=7) == (
        [("P#07", f"S#{s:03d}") for s in reversed(range(30))],
        5,
    )
    assert _pages(table, KeyConditionExpression=p & Key(schema.SK).gt("S#025"), ConsistentRead=True)[0] == [
        ("P#07", f"S#{s:03d}") for s in range(26, 30)
    ]
    assert _pages(table, KeyConditionExpression=p & Key(schema.SK).begins_with("S#01"), Limit=4) == (
        [("P#07", f"S#{s:03d}") for s in range(10, 20)],
        3,  # moto ends a page at the limit and looks no further
    )
    projected = table.query(KeyConditionExpression=p, ProjectionExpression="n")["Items"]
    assert projected == [{"n": s} for s in range(30)]
    assert table.query(KeyConditionExpression=Key(schema.PK).eq("P#99"))["Items"] == []
    assert listed and max(listed) == 30  # the partition, never the table's 600 items


def test_an_index_query_and_a_scan_answer_as_moto(table):
    keys, _ = _pages(table, IndexName=schema.GSI_PURPOSE, KeyConditionExpression=Key(schema.GSI_PURPOSE_PK).eq("G#0"))
    assert keys == [(f"P#{p:02d}", f"S#{s:03d}") for p in range(20) for s in range(0, 30, 6)]  # by the index's sort key
    newest, _ = _pages(
        table,
        IndexName=schema.GSI_PURPOSE,
        KeyConditionExpression=Key(schema.GSI_PURPOSE_PK).eq("G#1"),
        ScanIndexForward=False,
        Limit=9,
    )
    assert newest == [(f"P#{p:02d}", f"S#{s:03d}") for p in reversed(range(20)) for s in (27, 21, 15, 9, 3)]
    scanned, kwargs = [], {}
    while True:  # a Scan still pages through moto's sorted listing
        resp = table.scan(Limit=50, **kwargs)
        scanned += [(i[schema.PK], i[schema.SK]) for i in resp["Items"]]
        if "LastEvaluatedKey" not in resp:
            break
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
    assert scanned == [(f"P#{p:02d}", f"S#{s:03d}") for p in range(20) for s in range(30)]
