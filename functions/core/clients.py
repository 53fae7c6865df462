"""boto3 client factories: one client per service per process, with standard retries.

Endpoints come from the standard AWS configuration (``AWS_ENDPOINT_URL`` points every client at the
local moto server in the local deployment), so nothing here differs between AWS and local.
"""

import os
from functools import cache
from typing import Any

import boto3
from botocore.config import Config

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5})
# SigV4 presigned URLs (X-Amz-Expires honoured); path-style so a local endpoint works too.
_S3_CONFIG = _CONFIG.merge(Config(signature_version="s3v4", s3={"addressing_style": "path"}))


def _region() -> str:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


@cache
def client(service: str) -> Any:
    return boto3.client(service, config=_S3_CONFIG if service == "s3" else _CONFIG, region_name=_region())


@cache
def dynamodb_table(name: str) -> Any:
    return boto3.resource("dynamodb", config=_CONFIG, region_name=_region()).Table(name)


def reset() -> None:
    """Forget cached clients (tests that start a new moto mock call this)."""
    client.cache_clear()
    dynamodb_table.cache_clear()
