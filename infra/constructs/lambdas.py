"""The Lambda code asset and the defaults every function of the stack shares.

One asset for all functions: the ``functions/`` package plus its run-time dependencies (the
``[project].dependencies`` of pyproject.toml), bundled WITHOUT Docker: a local bundler runs
``pip install --platform manylinux2014_aarch64 --only-binary=:all: --python-version 3.12 --target``
so that pip picks the Linux ARM64 CPython 3.12 wheels (pydantic-core is compiled) on any host.

The installed dependencies are cached under ``build/lambda-deps/<hash of requirements + target>``,
so only the first synth on a machine reaches the package index; later synths (and the tests) just
copy. Delete that folder to pick up newer versions inside the declared ranges. The asset hash is
computed from the bundled output, so a changed handler or dependency always changes the asset.
"""

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.config import DeployConfig

from .common import acknowledge, log_group

REPO_ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS_DIR = REPO_ROOT / "functions"
PYPROJECT = REPO_ROOT / "pyproject.toml"
DEPS_CACHE = REPO_ROOT / "build" / "lambda-deps"

RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.ARM_64
#: What pip installs for: the runtime's interpreter on Amazon Linux 2023, ARM64.
PIP_TARGET = ("--platform", "manylinux2014_aarch64", "--implementation", "cp", "--python-version", "3.12")
_NOT_SHIPPED = ("__pycache__", "*.pyc", "*.pyo")


def runtime_requirements() -> list[str]:
    """The Lambdas' run-time dependencies, as pyproject.toml declares them."""
    with PYPROJECT.open("rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def install_dependencies(requirements: Sequence[str], cache: Path = DEPS_CACHE) -> Path:
    """A directory with ``requirements`` installed for the Lambda runtime (cached by content)."""
    key = hashlib.sha256(json.dumps([sorted(requirements), PIP_TARGET]).encode()).hexdigest()[:16]
    target = cache / key
    if (target / ".complete").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=cache))
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-qq",
                "--disable-pip-version-check",
                "--no-compile",
                "--only-binary=:all:",
                *PIP_TARGET,
                "--target",
                str(staging),
                *requirements,
            ],
            check=True,
        )
        (staging / ".complete").write_text("\n".join(requirements) + "\n")
        try:
            staging.rename(target)
        except OSError:  # a concurrent synth finished first
            if not (target / ".complete").exists():
                raise
            shutil.rmtree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


@jsii.implements(cdk.ILocalBundling)
class LocalPipBundling:
    """Bundles the asset on this machine (no Docker): dependencies, then the ``functions`` package."""

    def __init__(self, requirements: Sequence[str]) -> None:
        self.requirements = list(requirements)

    def try_bundle(self, output_dir: str, *_: Any, **__: Any) -> bool:  # jsii passes the options struct
        deps = install_dependencies(self.requirements)
        shutil.copytree(deps, output_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".complete", *_NOT_SHIPPED))
        shutil.copytree(
            FUNCTIONS_DIR,
            Path(output_dir) / FUNCTIONS_DIR.name,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns(*_NOT_SHIPPED),
        )
        return True


def functions_code() -> lambda_.Code:
    """The one code asset of the stack (create it once and share it between functions)."""
    return lambda_.Code.from_asset(
        str(FUNCTIONS_DIR),
        exclude=["**/__pycache__", "**/*.pyc"],
        asset_hash_type=cdk.AssetHashType.OUTPUT,
        bundling=cdk.BundlingOptions(
            # Required by the API but never used: local bundling always succeeds or raises.
            image=RUNTIME.bundling_image,
            local=LocalPipBundling(runtime_requirements()),
        ),
    )


class Lambdas(Construct):
    """Holds the shared code asset and makes functions with the stack's defaults: ARM64, the
    pinned Python runtime, X-Ray active tracing, and a role that can write only to the function's
    own log group (no AWS-managed policy)."""

    def __init__(self, scope: Construct, id: str, *, config: DeployConfig) -> None:
        super().__init__(scope, id)
        self.config = config
        self.code = functions_code()

    def function(
        self,
        scope: Construct,
        id: str,
        *,
        handler: str,
        environment: Mapping[str, str],
        description: str,
        memory_size: int = 512,
        timeout: cdk.Duration = cdk.Duration.seconds(30),
    ) -> lambda_.Function:
        logs = log_group(scope, f"{id}Logs", self.config)
        role = iam.Role(scope, f"{id}Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        fn = lambda_.Function(
            scope,
            id,
            code=self.code,
            handler=handler,
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            memory_size=memory_size,
            timeout=timeout,
            environment=dict(environment),
            description=description,
            role=role,
            log_group=logs,
            tracing=lambda_.Tracing.ACTIVE,
        )
        logs.grant_write(role)
        acknowledge(
            fn,
            "AwsSolutions-L1",
            f"The runtime is pinned ({RUNTIME.name}) to the interpreter the dependencies are bundled for; "
            "upgrading it is a deliberate change (lambdas.RUNTIME and PIP_TARGET together).",
        )
        acknowledge(
            role,
            "AwsSolutions-IAM5[Resource::*]",
            "Only actions without resource-level permissions: X-Ray PutTraceSegments/PutTelemetryRecords "
            "(active tracing) and, for stream consumers, dynamodb:ListStreams.",
        )
        return fn
