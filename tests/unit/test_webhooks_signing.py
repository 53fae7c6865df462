"""Our webhook signatures, verified by the official openai SDK (``client.webhooks.unwrap``) and by
the Standard Webhooks library, as a receiver verifies them."""

import base64
import json
import time
from datetime import UTC

import openai
import pytest
import standardwebhooks

from functions.webhooks import logic, signing

SDK = openai.OpenAI(api_key="unused", base_url="http://127.0.0.1:9")


def delivery(secrets_: list[str], *, body: str | None = None, at: int | None = None) -> tuple[str, dict[str, str]]:
    body = body or logic.payload("batch.completed", "batch_abc", 1_700_000_000)
    return body, signing.headers(secrets_, "wh_123", at if at is not None else int(time.time()), body)


def test_a_new_secret_is_whsec_and_32_random_bytes() -> None:
    a, b = signing.new_secret(), signing.new_secret()
    assert a.startswith("whsec_") and a != b
    assert len(base64.b64decode(a.removeprefix("whsec_"))) == 32


def test_the_sdk_unwraps_a_signed_delivery_into_openais_batch_event() -> None:
    secret = signing.new_secret()
    body, headers = delivery([secret])
    event = SDK.webhooks.unwrap(body, headers, secret=secret)
    assert type(event).__name__ == "BatchCompletedWebhookEvent"
    assert event.type == "batch.completed" and event.object == "event" and event.data.id == "batch_abc"
    assert event.created_at == 1_700_000_000 and event.id.startswith("evt_")
    assert set(json.loads(body)) == {"id", "object", "created_at", "type", "data"}


@pytest.mark.parametrize("event_type", ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"])
def test_every_batch_event_type_unwraps_to_its_sdk_type(event_type: str) -> None:
    secret = signing.new_secret()
    body, headers = delivery([secret], body=logic.payload(event_type, "batch_x", 1))
    event = SDK.webhooks.unwrap(body, headers, secret=secret)
    assert event.type == event_type
    assert type(event).__name__.lower().startswith(event_type.replace(".", ""))


def test_standard_webhooks_library_verifies_the_same_delivery() -> None:
    secret = signing.new_secret()
    body, headers = delivery([secret])
    assert standardwebhooks.Webhook(secret).verify(body, headers)["data"] == {"id": "batch_abc"}


def test_our_signature_is_the_librarys_signature() -> None:
    from datetime import datetime, timezone

    secret = signing.new_secret()
    theirs = standardwebhooks.Webhook(secret).sign("wh_1", datetime.fromtimestamp(1_700_000_000, tz=UTC), "{}")
    assert signing.sign(secret, "wh_1", 1_700_000_000, "{}") == theirs


def test_a_wrong_secret_a_tampered_body_or_an_old_timestamp_is_rejected() -> None:
    secret = signing.new_secret()
    body, headers = delivery([secret])
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.unwrap(body, headers, secret=signing.new_secret())
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.unwrap(body.replace("batch_abc", "batch_abd"), headers, secret=secret)
    old_body, old_headers = delivery([secret], at=int(time.time()) - 301)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        SDK.webhooks.unwrap(old_body, old_headers, secret=secret)


def test_during_a_kept_rotation_both_secrets_verify() -> None:
    old, new = signing.new_secret(), signing.new_secret()
    body, headers = delivery([new, old])
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (old, new):
        assert SDK.webhooks.unwrap(body, headers, secret=secret).data.id == "batch_abc"
        assert standardwebhooks.Webhook(secret).verify(body, headers)
