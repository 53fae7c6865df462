"""boto3 client factories: one client per service per process, with standard retries.

Endpoints come from the standard AWS configuration (``AWS_ENDPOINT_URL`` points every client at the
local moto server in the local deployment), so nothing here differs between AWS and local.
"""

import os
import threading
from functools import cache
from typing import Any

import boto3
import boto3.session
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


_per_thread = threading.local()
#: Bumped by ``reset``: every thread's resources are made again on its next call.
_generation = 0


def thread_dynamodb_table(name: str) -> Any:
    """This thread's own ``Table`` resource for ``name``: boto3 resources (and sessions) are not
    thread-safe, clients are (boto3 docs, "Multithreading or multiprocessing with resources"), so
    a store called from several threads at once gives each thread its resource, from its own
    session."""
    tables = getattr(_per_thread, "tables", None)
    if tables is None or _per_thread.generation != _generation:
        tables, _per_thread.generation = {}, _generation
        _per_thread.tables = tables
    if name not in tables:
        tables[name] = boto3.session.Session().resource("dynamodb", config=_CONFIG, region_name=_region()).Table(name)
    return tables[name]


def reset() -> None:
    """Forget cached clients (tests that start a new moto mock call this)."""
    global _generation
    client.cache_clear()
    dynamodb_table.cache_clear()
    _generation += 1
