"""Stores called from several threads at once (the GPU worker's store threads): the worker's AWS
set says it may be (``Stores.concurrent``), because its DynamoDB table is a boto3 resource per thread
(``clients.thread_dynamodb_table``; boto3 resources are not thread-safe, clients are); the fakes
do not say so, and the worker gives them one thread. And the local moto's DynamoDB takes one call
at a time (``infra.local.atomic_dynamodb``), as AWS makes each write atomic."""

import threading

import pytest
from moto import mock_aws

from functions.core import clients
from functions.core.aws import stores_from_settings
from functions.core.aws.dynamodb import Table
from infra.local import atomic_dynamodb
from tests.conftest import TEST_SETTINGS
from tests.fakes.aws import fake_stores


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    return out[0]


def test_each_thread_gets_its_own_table_resource_and_reset_makes_new_ones(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mine = clients.thread_dynamodb_table("t")
    assert clients.thread_dynamodb_table("t") is mine  # one per thread, kept
    theirs = _in_thread(lambda: clients.thread_dynamodb_table("t"))
    assert theirs is not mine and theirs.name == mine.name == "t"
    clients.reset()
    assert clients.thread_dynamodb_table("t") is not mine


def test_the_table_adapter_uses_the_calling_thread_s_resource():
    made = []

    def per_thread():
        made.append(threading.get_ident())
        return threading.get_ident()

    table = Table(per_thread=per_thread)
    assert table._table == threading.get_ident()
    assert _in_thread(lambda: table._table) != threading.get_ident()
    with pytest.raises(ValueError):
        Table()
    with pytest.raises(ValueError):
        Table(object(), per_thread=per_thread)


def test_the_worker_s_aws_stores_are_concurrent_a_lambda_s_and_the_fakes_are_not(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    worker = stores_from_settings(TEST_SETTINGS, concurrent=True)
    assert worker.concurrent is True
    mine = worker.batches._table._table
    assert mine is clients.thread_dynamodb_table(TEST_SETTINGS.table_name)
    assert _in_thread(lambda: worker.batches._table._table) is not mine  # another thread: its own
    lambda_ = stores_from_settings(TEST_SETTINGS)
    assert lambda_.concurrent is False
    assert lambda_.batches._table._table is clients.dynamodb_table(TEST_SETTINGS.table_name)
    assert _in_thread(lambda: lambda_.batches._table._table) is clients.dynamodb_table(TEST_SETTINGS.table_name)
    assert fake_stores().concurrent is False and fake_stores().prepare is None
    assert lambda_.prepare is None

    def prepared_here():
        before = dict(getattr(clients._per_thread, "tables", {}))
        worker.prepare()
        return before, dict(clients._per_thread.tables)

    before, after = _in_thread(prepared_here)
    assert TEST_SETTINGS.table_name not in before and after[TEST_SETTINGS.table_name] is not mine


@mock_aws
def test_a_dynamodb_call_waits_while_another_holds_moto_s_table():
    atomic_dynamodb.install()
    atomic_dynamodb.install()  # idempotent: not wrapped twice
    from moto.dynamodb.models import DynamoDBBackend

    assert getattr(DynamoDBBackend.put_item, "__wrapped_atomic__", False)
    assert not getattr(DynamoDBBackend.put_item.__wrapped__, "__wrapped_atomic__", False)
    client = clients.client("dynamodb")
    client.create_table(
        TableName="atomic",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    done = threading.Event()

    def put():
        client.put_item(TableName="atomic", Item={"pk": {"S": "a"}})
        done.set()

    with atomic_dynamodb.lock():  # as if another request were inside the backend
        writer = threading.Thread(target=put)
        writer.start()
        assert not done.wait(0.5)  # it waits for the backend
    assert done.wait(10)
    writer.join(10)
    assert client.get_item(TableName="atomic", Key={"pk": {"S": "a"}})["Item"] == {"pk": {"S": "a"}}


def _table(client, name):
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


@mock_aws
def test_a_cancelled_transaction_leaves_every_item_as_it_was_and_a_passing_one_applies_all():
    atomic_dynamodb.install()  # moto's whole-table backup replaced by one of the items named
    client = clients.client("dynamodb")
    _table(client, "tx")

    def key(pk, sk):
        return {"pk": {"S": pk}, "sk": {"S": sk}}

    client.put_item(TableName="tx", Item={**key("a", "1"), "n": {"N": "1"}, "tag": {"S": "old"}})
    client.put_item(TableName="tx", Item={**key("c", "1"), "state": {"S": "open"}})
    for i in range(50):  # the rest of the table, untouched either way
        client.put_item(TableName="tx", Item={**key("other", str(i)), "n": {"N": str(i)}})
    ops = [
        {
            "Update": {
                "TableName": "tx",
                "Key": key("a", "1"),
                "UpdateExpression": "ADD n :one SET tag = :new",
                "ExpressionAttributeValues": {":one": {"N": "1"}, ":new": {"S": "new"}},
            }
        },
        {"Put": {"TableName": "tx", "Item": {**key("b", "1"), "n": {"N": "9"}}}},
        {
            "ConditionCheck": {
                "TableName": "tx",
                "Key": key("c", "1"),
                "ConditionExpression": "#s = :closed",
                "ExpressionAttributeNames": {"#s": "state"},
                "ExpressionAttributeValues": {":closed": {"S": "closed"}},
            }
        },
    ]
    with pytest.raises(client.exceptions.TransactionCanceledException) as cancelled:
        client.transact_write_items(TransactItems=ops)
    assert [r["Code"] for r in cancelled.value.response["CancellationReasons"]] == [
        "None",
        "None",
        "ConditionalCheckFailed",
    ]
    assert client.get_item(TableName="tx", Key=key("a", "1"))["Item"] == {
        **key("a", "1"),
        "n": {"N": "1"},
        "tag": {"S": "old"},
    }
    assert "Item" not in client.get_item(TableName="tx", Key=key("b", "1"))
    assert client.scan(TableName="tx")["Count"] == 52
    client.put_item(TableName="tx", Item={**key("c", "1"), "state": {"S": "closed"}})
    client.transact_write_items(TransactItems=ops)
    assert client.get_item(TableName="tx", Key=key("a", "1"))["Item"] == {
        **key("a", "1"),
        "n": {"N": "2"},
        "tag": {"S": "new"},
    }
    assert client.get_item(TableName="tx", Key=key("b", "1"))["Item"] == {**key("b", "1"), "n": {"N": "9"}}


@mock_aws
def test_an_answer_is_read_from_the_item_under_the_lock_so_no_write_can_tear_it(monkeypatch):
    """moto answers a GetItem or a Query from its stored items themselves: the answer must be built
    while no other request can write them (AWS never returns half an update)."""
    atomic_dynamodb.install()
    from moto.dynamodb import responses

    serialized_under_lock = []
    to_dict = responses.dynamo_to_dict

    def recording(obj):
        serialized_under_lock.append(atomic_dynamodb.lock()._is_owned())  # type: ignore[attr-defined]
        return to_dict(obj)

    monkeypatch.setattr(responses, "dynamo_to_dict", recording)
    client = clients.client("dynamodb")
    _table(client, "reads")
    key = {"pk": {"S": "a"}, "sk": {"S": "1"}}
    client.put_item(TableName="reads", Item={**key, "n": {"N": "1"}})
    assert client.get_item(TableName="reads", Key=key)["Item"] == {**key, "n": {"N": "1"}}
    assert serialized_under_lock and all(serialized_under_lock)
    assert not atomic_dynamodb.lock()._is_owned()  # type: ignore[attr-defined]  # released after the answer
