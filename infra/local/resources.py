"""Creates the deployment's AWS resources on moto from the same definitions the CDK stack uses."""

from typing import Any

from functions.core import schema
from functions.core.settings import Settings


def create_resources(settings: Settings, *, dynamodb: Any, s3: Any) -> None:
    """Idempotently create the table and bucket named by ``settings``."""
    existing = dynamodb.list_tables()["TableNames"]
    if settings.table_name not in existing:
        dynamodb.create_table(TableName=settings.table_name, **schema.TABLE_SCHEMA)
        dynamodb.update_time_to_live(
            TableName=settings.table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": schema.TTL},
        )
    buckets = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if settings.bucket_name not in buckets:
        s3.create_bucket(Bucket=settings.bucket_name)
