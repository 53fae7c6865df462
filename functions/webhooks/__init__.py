"""Webhooks (docs/webhooks.md): per-tenant endpoints, OpenAI's event payloads, Standard Webhooks
signatures, at-least-once delivery from an SQS queue with a stated backoff schedule.

- ``signing``: secrets (``whsec_`` + base64) and the ``webhook-*`` headers.
- ``store``: endpoint records and the delivery-attempt log, on the deployment's table.
- ``logic``: fan-out (one delivery per event and endpoint) and one delivery attempt.
- ``handler``: the Lambda (SQS) glue.
"""
