"""Counts, not timings: the AWS requests the audit appender makes per intent and per checkpoint
(docs/audit.md, "Costs"). The real handler on moto in-process (the resources as the local
deployment creates them, the appender signing with a KMS key as on AWS) drains ``--intents`` API
intents of one tenant sent to the audit queue, in invocations of ``--batch`` (10: the FIFO
maximum; 1: one intent per invocation, the worst case for checkpoints), then the same intents
again (a redelivery: duplicates). Every request from the first invocation on is counted with a
botocore hook (tests/bench/chunk_requests.py), SQS's own (receive, delete) included.

    .venv/bin/python -m tests.bench.audit_requests [--intents 100] [--batch 10]
"""

import argparse
import json
import os

import boto3
from moto import mock_aws

from tests.bench.chunk_requests import count_requests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--intents", type=int, default=100)
    p.add_argument("--batch", type=int, default=10)
    args = p.parse_args()
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        os.environ[name] = value
    counter = count_requests()  # before any session exists
    with mock_aws():
        from functions.audit_append import handler
        from functions.core import audit, clients, deps
        from infra.local.lambda_context import LocalLambdaContext
        from infra.local.pollers import sqs_event
        from infra.local.resources import create_resources
        from tests.conftest import PREFIX, TEST_SETTINGS

        clients.reset()
        settings = create_resources(TEST_SETTINGS, clients.client, prefix=PREFIX)
        key = boto3.client("kms").create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]["Arn"]
        os.environ.update(settings.model_copy(update={"audit_signing_key_id": key}).to_env())
        deps.reset()
        intents = [
            audit.api_intent(
                "acme",
                method="POST",
                path="/v1/files",
                status=200,
                body=f'{{"id": "file-{i}"}}',
                authorization="Bearer sk-x",
                request_id=f"req-{i}",
                at=1_800_000_000 + i,
            )
            for i in range(args.intents)
        ]
        sqs = boto3.client("sqs")
        arn = sqs.get_queue_attributes(QueueUrl=settings.audit_queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        rows = {}
        for label in ("first delivery", "redelivery"):
            for i, intent in enumerate(intents):
                sqs.send_message(
                    QueueUrl=settings.audit_queue_url,
                    MessageBody=intent.model_dump_json(),
                    MessageGroupId="acme",
                    MessageDeduplicationId=f"{label}-{i}",
                )
            counter.clear()
            while received := sqs.receive_message(
                QueueUrl=settings.audit_queue_url, MaxNumberOfMessages=args.batch, AttributeNames=["All"]
            ).get("Messages", []):
                result = handler.handler(sqs_event(received, arn), LocalLambdaContext("audit-append"))
                assert not result["batchItemFailures"], result
                sqs.delete_message_batch(
                    QueueUrl=settings.audit_queue_url,
                    Entries=[{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(received)],
                )
            requests = dict(sorted(counter.items()))
            rows[label] = {
                "requests": requests,
                "per_intent": round(sum(requests.values()) / args.intents, 2),
                "invocations": -(-args.intents // args.batch),
            }
        print(json.dumps({"intents": args.intents, "batch": args.batch, **rows}, indent=1))


if __name__ == "__main__":
    main()
