"""``batchctl webhooks ...`` on moto: the secret is shown once (create, rotate), listings mask it,
HTTPS only on AWS (loopback http only locally), rotate with and without keeping the old secret,
delete, and the delivery log the operator reads."""

import io
import json
import time

import openai
import pytest

from batchctl import cli
from batchctl import webhooks as cmd
from functions.core import clients
from functions.core.aws.dynamodb import Table
from functions.core.settings import Settings
from functions.webhooks import signing
from functions.webhooks.store import AttemptRecord, WebhookRepo

SDK = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")


@pytest.fixture
def repo(aws: Settings) -> WebhookRepo:
    return WebhookRepo(Table(clients.dynamodb_table(aws.table_name)))


def run(repo: WebhookRepo, *argv: str, local: bool = False, now: int = 1_800_000_000) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = cli.parser().parse_args(["webhooks", *argv])
    code = cmd.run(args, repo, local=local, now=now, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_create_shows_the_secret_once_and_list_masks_it(repo: WebhookRepo) -> None:
    code, out, _ = run(
        repo,
        "create",
        "--tenant",
        "acme",
        "--url",
        "https://hooks.example.com/x",
        "--events",
        "batch.completed,batch.failed",
    )
    assert code == 0
    created = json.loads(out)
    assert created["signing_secret"].startswith("whsec_") and created["id"].startswith("we_")
    assert created["events"] == ["batch.completed", "batch.failed"]
    _, listed, _ = run(repo, "list", "--tenant", "acme")
    [shown] = json.loads(listed)
    assert created["signing_secret"] not in listed and "signing_secret" not in shown
    assert shown["signing_secret_hint"].startswith("whsec_") and shown["url"] == "https://hooks.example.com/x"
    _, other, _ = run(repo, "list", "--tenant", "globex")
    assert json.loads(other) == []


@pytest.mark.parametrize(
    ("url", "local", "ok"),
    [
        ("https://hooks.example.com/x", False, True),
        ("http://hooks.example.com/x", False, False),
        ("http://127.0.0.1:8080/x", False, False),  # AWS: HTTPS only
        ("http://127.0.0.1:8080/x", True, True),  # local: loopback http
        ("http://[::1]:8080/x", True, True),
        ("http://10.0.0.5/x", True, False),
        ("ftp://127.0.0.1/x", True, False),
    ],
)
def test_https_only_on_aws_loopback_http_locally(repo: WebhookRepo, url: str, local: bool, ok: bool) -> None:
    code, _, err = run(repo, "create", "--tenant", "acme", "--url", url, local=local)
    assert (code == 0) is ok, err


def test_unknown_events_are_refused() -> None:
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["webhooks", "create", "--tenant", "a", "--url", "https://x", "--events", "batch.done"])


def test_rotate_replaces_the_secret_and_keep_old_signs_with_both(repo: WebhookRepo) -> None:
    now = 1_800_000_000
    _, out, _ = run(repo, "create", "--tenant", "acme", "--url", "https://h.example.com/", now=now)
    first = json.loads(out)
    code, out, _ = run(repo, "rotate", "--tenant", "acme", first["id"], "--keep-old-24h", now=now)
    second = json.loads(out)
    assert code == 0 and second["signing_secret"] != first["signing_secret"]
    record = repo.get("acme", first["id"])
    assert record.signing_secrets(now + 86_399) == [second["signing_secret"], first["signing_secret"]]
    assert record.signing_secrets(now + 86_400) == [second["signing_secret"]]
    body = '{"id":"evt_1","object":"event","created_at":1,"type":"batch.completed","data":{"id":"batch_1"}}'
    at = int(time.time())
    headers = signing.headers(record.signing_secrets(now + 10), "wh_1", at, body)
    assert SDK.webhooks.unwrap(body, headers, secret=first["signing_secret"]).data.id == "batch_1"
    run(repo, "rotate", "--tenant", "acme", first["id"], now=now + 20)
    record = repo.get("acme", first["id"])
    assert record.signing_secrets(now + 21) == [record.secret]  # without --keep-old-24h: the new one only
    headers = signing.headers(record.signing_secrets(now + 21), "wh_1", at, body)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.unwrap(body, headers, secret=second["signing_secret"])


def test_delete_and_missing_endpoints(repo: WebhookRepo) -> None:
    _, out, _ = run(repo, "create", "--tenant", "acme", "--url", "https://h.example.com/")
    endpoint_id = json.loads(out)["id"]
    assert run(repo, "delete", "--tenant", "globex", endpoint_id)[0] == 1  # another tenant's: not found
    assert run(repo, "delete", "--tenant", "acme", endpoint_id)[0] == 0
    assert run(repo, "delete", "--tenant", "acme", endpoint_id)[0] == 1
    assert run(repo, "rotate", "--tenant", "acme", endpoint_id)[0] == 1
    assert repo.list("acme") == []


def test_deliveries_lists_attempts_newest_first(repo: WebhookRepo) -> None:
    now = 1_800_000_000
    for n, (endpoint, outcome) in enumerate([("we_a", "retry"), ("we_b", "retry"), ("we_a", "delivered")], start=1):
        repo.log(
            AttemptRecord(
                tenant="acme",
                endpoint_id=endpoint,
                webhook_id=f"wh_{endpoint}",
                event_id="evt_1",
                event_type="batch.completed",
                attempt=n,
                at=now + n,
                outcome=outcome,
            )
        )
    _, out, _ = run(repo, "deliveries", "--tenant", "acme", now=now + 10)
    assert [json.loads(line)["attempt"] for line in out.splitlines()] == [3, 2, 1]
    _, out, _ = run(repo, "deliveries", "--tenant", "acme", "--endpoint", "we_a", now=now + 10)
    assert [json.loads(line)["outcome"] for line in out.splitlines()] == ["delivered", "retry"]
    _, out, _ = run(repo, "deliveries", "--tenant", "acme", now=now + 30 * 86_400 + 2)  # past the log's TTL
    assert [json.loads(line)["attempt"] for line in out.splitlines()] == [3]
