"""The reaper: removes a file's S3 bytes when its DynamoDB record goes (API delete or TTL expiry).

It reads the table's stream (OLD_IMAGE), filtered at the event source mapping to REMOVE events of
file items and of uploads that still held stored bytes, so it is invoked only for what it acts on:
a file's bytes go, and what a file or upload held on its tenant's stored-bytes ledger is released
(once: the release deletes the holder's marker). Records it cannot process after retries are sent
to a dead-letter queue (watched by monitoring) instead of being dropped with the stream.
"""

import aws_cdk as cdk
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from functions.core import schema
from functions.core.records import FileRecord, UploadRecord
from functions.core.settings import Settings
from infra.config import DeployConfig

from .common import acknowledge_wildcards, arn_in_findings, consume_table_stream, grant_storage_release
from .lambdas import Lambdas
from .storage import Storage


def stream_filter() -> dict:
    """REMOVE events of file items (their old sort key starts with the file prefix)."""
    return {
        "eventName": lambda_.FilterRule.is_equal("REMOVE"),
        "dynamodb": {"OldImage": {schema.SK: {"S": lambda_.FilterRule.begins_with(FileRecord.sort_key(""))}}},
    }


def upload_filter() -> dict:
    """REMOVE events of upload items that still held stored bytes (expired or cancelled: a completed
    upload handed its reservation to its File, and its record says ``holds_storage`` no more)."""
    return {
        "eventName": lambda_.FilterRule.is_equal("REMOVE"),
        "dynamodb": {
            "OldImage": {
                schema.SK: {"S": lambda_.FilterRule.begins_with(UploadRecord.sort_key(""))},
                "holds_storage": {"BOOL": [True]},
            }
        },
    }


class Reaper(Construct):
    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        config: DeployConfig,
        storage: Storage,
        lambdas: Lambdas,
        settings: Settings,
    ) -> None:
        super().__init__(scope, id)
        self.function = lambdas.function(
            self,
            "Function",
            handler="functions.reaper.handler.handler",
            environment=settings.to_env(),
            description="Deletes the S3 bytes of removed or expired files (table stream)",
            memory_size=256,
            timeout=cdk.Duration.seconds(60),
        )
        # It only deletes objects; the stream read comes with the event source below.
        storage.bucket.grant_delete(self.function)
        acknowledge_wildcards(
            self.function.role,
            {
                f"Resource::{arn_in_findings(storage.bucket)}/*": "A removed file's object can be any tenant's "
                "(files/<tenant>/<id>); deletion only, on this bucket's objects.",
                "Action::s3:DeleteObject*": "grant_delete's action group (DeleteObject, DeleteObjectVersion, "
                "DeleteObjectTagging...), on this bucket's objects only.",
            },
        )

        grant_storage_release(self.function, storage)  # the ledger's marker and counter (T#*#STORAGE)

        self.dead_letters = consume_table_stream(
            self,
            self.function,
            storage.table,
            of="the reaper's stream mapping",
            pattern=stream_filter(),
            also=(upload_filter(),),
            batching_seconds=5,
            retry_attempts=5,
        )
