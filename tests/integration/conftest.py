"""Integration fixtures: moto (mocked before any client exists), the resources built from the same
definitions as the stack, and the local HTTP front in a thread so the official openai SDK can
drive the real handlers."""

import contextlib
import functools
import json
import threading
import time
from collections.abc import Iterator
from unittest import mock

import boto3
import boto3.session
import pytest
from moto import mock_aws
from openai import OpenAI

from functions.api import handler as api_handler
from functions.authorizer import handler as authorizer_handler
from functions.core import auth, clients, deps
from functions.core.settings import Settings
from infra.local import atomic_dynamodb, moto_query
from infra.local.front import LocalApi, make_server
from infra.local.resources import create_resources, ingest_queue_url
from tests.conftest import PREFIX
from tests.helpers import sdk_client


class Clock:
    """The API's clock, moved by tests (e.g. past an expiry)."""

    def __init__(self) -> None:
        self.now = int(time.time())

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Iterator[Clock]:
    """The clock the handlers take time from (``deps.use_clock``), for this test."""
    c = Clock()
    deps.use_clock(c)
    yield c
    deps.use_clock(None)


#: moto runs state machines for tests marked ``workflow``; its Lambda tasks reach our handler.
EXECUTE_WORKFLOWS = {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}


def _invoke_workflow_handler(self, function_name, qualifier, body, headers, response_headers):
    """Stands in for moto's no-Docker Lambda backend: the state machine's Lambda tasks run our
    workflow handler (errors shaped as the Lambda runtime reports them)."""
    from functions.workflow import handler as workflow_handler
    from infra.local.lambda_context import LocalLambdaContext

    try:
        return json.dumps(workflow_handler.handler(json.loads(body or "{}"), LocalLambdaContext("workflow"))).encode()
    except Exception as exc:
        response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps({"errorMessage": str(exc), "errorType": type(exc).__name__}).encode()


def _finish_executions(state_machine_arn: str) -> None:
    """Fail any execution a test left waiting, and wait until none runs (their threads would
    otherwise outlive the mock)."""
    sfn = clients.client("stepfunctions")
    for _ in range(200):
        running = sfn.list_executions(stateMachineArn=state_machine_arn, statusFilter="RUNNING")["executions"]
        if not running:
            return
        for execution in running:
            batch_input = json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"])
            batch = deps.stores().batches.get(batch_input["tenant"], batch_input["batch_id"])
            if batch and batch.task_token:
                try:
                    sfn.send_task_failure(taskToken=batch.task_token, error="TestTeardown")
                except sfn.exceptions.ClientError:
                    pass
        time.sleep(0.05)
    raise AssertionError("executions still running after the test")


@functools.cache
def _boto3_session() -> boto3.session.Session:
    """One boto3 session for every test of the process. moto sets ``boto3.DEFAULT_SESSION`` to None
    for each mock, so each test's clients would each load their service model and endpoint rules
    into a new session again (about 45 ms a client, a dozen clients a test); from this session they
    are made from what it has loaded. A session holds no AWS state: the clients still reach the
    test's own mock (moto's stubber runs on every client's request events while a mock is on), with
    the fake credentials moto sets while it is."""
    return boto3.session.Session()


@pytest.fixture
def aws(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Settings]:
    """moto in decorator mode with the deployment's resources, and handlers configured for them.
    Yields the settings pointing at the created queues and state machine."""
    execute = request.node.get_closest_marker("workflow") is not None
    with contextlib.ExitStack() as stack:
        atomic_dynamodb.install()  # each DynamoDB call atomic, as AWS's (the worker calls from threads)
        moto_query.install()  # a Query lists its partition, not the table, as the local deployment's
        stack.enter_context(mock_aws(config=EXECUTE_WORKFLOWS if execute else None))
        boto3.DEFAULT_SESSION = _boto3_session()  # the mock puts back the one it found when it stops
        if execute:
            from moto.awslambda_simple.models import LambdaSimpleBackend

            stack.enter_context(mock.patch.object(LambdaSimpleBackend, "invoke", _invoke_workflow_handler))
        deps.reset()
        concrete = create_resources(
            settings, clients.client, prefix=PREFIX, workflow_function_arn=WORKFLOW_FUNCTION_ARN
        )
        # Configuring the bucket notification sent an s3:TestEvent; start from an empty queue.
        clients.client("sqs").purge_queue(QueueUrl=ingest_queue_url(clients.client, PREFIX))
        # The audit appender signs with a key file, as in the local deployment (docs/audit.md).
        key_file = tmp_path_factory.mktemp("audit-key") / "audit-signing-key.pem"
        concrete = concrete.model_copy(update={"audit_local_key_file": str(key_file)})
        for name, value in concrete.to_env().items():
            monkeypatch.setenv(name, value)
        deps.reset()
        yield concrete
        if execute:
            _finish_executions(concrete.state_machine_arn)
        deps.reset()


WORKFLOW_FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:batch-api-test-workflow"


@pytest.fixture
def deployed(aws: Settings) -> Settings:
    """The settings of the deployment under test (queue URLs and state machine filled in)."""
    return aws


@pytest.fixture
def stores(aws: Settings):
    return deps.stores()


class AuditAppender:
    """The audit appender as its event source mapping runs it (the real handler on the audit
    queue), and the chains it writes, read from the table."""

    def __init__(self, settings: Settings):
        from functions.core.aws.audit import AuditRepo
        from functions.core.aws.dynamodb import Table
        from functions.core.aws.s3 import WormObjects

        self.settings = settings
        self.chain = AuditRepo(Table(clients.dynamodb_table(settings.table_name)))
        self.worm = WormObjects(clients.client("s3"), settings.audit_bucket_name)

    def drain(self) -> int:
        """Append every intent waiting in the audit queue; how many were handled."""
        from functions.audit_append import handler
        from infra.local.pollers import drain_queue

        return drain_queue(clients.client("sqs"), self.settings.audit_queue_url, handler.handler, name="audit-append")

    def records(self, tenant: str):
        """``tenant``'s chain once every intent sent so far is appended."""
        self.drain()
        return self.chain.records(tenant)

    def public_key(self) -> bytes:
        from functions.audit_append.handler import signer

        return signer(self.settings).public_key()


@pytest.fixture
def appender(aws: Settings) -> AuditAppender:
    return AuditAppender(aws)


@pytest.fixture
def api_url(aws: None) -> Iterator[str]:
    """The local front on an ephemeral port, calling the real handlers in-process."""
    server = make_server(LocalApi(api_handler.handler, authorizer_handler.handler), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def keys(stores) -> dict[str, str]:
    """An API key for each of two tenants."""
    return {tenant: auth.create_key(stores.keys, tenant, now=0) for tenant in ("acme", "globex")}


@pytest.fixture
def client(api_url: str, keys: dict[str, str]) -> OpenAI:
    return sdk_client(api_url, keys["acme"], max_retries=0)


@pytest.fixture
def other_client(api_url: str, keys: dict[str, str]) -> OpenAI:
    return sdk_client(api_url, keys["globex"], max_retries=0)


@pytest.fixture
def raw(api_url: str, keys: dict[str, str]):
    """A plain HTTP client as tenant acme (no redirects followed), for exact status/body checks."""
    from tests.helpers import raw_client

    with raw_client(api_url, keys["acme"]) as http:
        yield http
