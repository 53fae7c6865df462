"""The upload assembler (docs/uploads.md): the queue ``complete`` hands uploads larger than
``limits.UPLOAD_INLINE_ASSEMBLY_BYTES`` to, and the Lambda it feeds (``functions/assembler``).

One message per completed Upload (batch size 1): the function streams the Upload's parts into the
File's object (one S3 multipart upload, every byte read once and written once, md5 on the way), so
its time grows with the file: 8 GB at 10 MB/s fits in Lambda's 15 minutes, and at 1,769 MB of
memory a Lambda has a full vCPU for the md5. After ``limits.ASSEMBLER_MAX_RECEIVES`` deliveries
the last attempt marks the File ``error``; the message then goes to the dead-letter queue
(watched by monitoring).

Its rights: the table (read the Upload and File, settle the File), read and delete under
``uploads/`` (parts and manifest), write under ``files/`` (the assembled object).
"""

from collections.abc import Iterable

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_event_sources as sources
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from functions.core import limits, schema
from functions.core.settings import Settings
from infra.config import DeployConfig

from .common import acknowledge_data_grants, acknowledge_wildcards, dead_letter_queue
from .lambdas import Lambdas
from .storage import Storage

UPLOAD_KEYS = schema.UPLOADS_PREFIX + "*"
FILE_KEYS = schema.file_key("*", "*")
ASSEMBLER_TIMEOUT = cdk.Duration.seconds(limits.ASSEMBLER_TIMEOUT_SECONDS)
#: AWS's guidance for SQS event sources: visibility at least six times the function timeout.
ASSEMBLY_VISIBILITY = cdk.Duration.seconds(6 * limits.ASSEMBLER_TIMEOUT_SECONDS)
#: 1,769 MB is one full vCPU (the md5 is CPU-bound); memory use itself is a few parts (~30 MB).
ASSEMBLER_MEMORY = 1769


class Uploads(Construct):
    """``queue`` (+ ``dead_letters``), ``function`` (the assembler) and ``settings``: the given
    settings with ``assembly_queue_url`` set (every function reads the same Settings)."""

    def __init__(
        self, scope: Construct, id: str, *, config: DeployConfig, storage: Storage, lambdas: Lambdas, settings: Settings
    ) -> None:
        super().__init__(scope, id)
        self.dead_letters = dead_letter_queue(self, "DeadLetters", of="the assembly queue's")
        self.queue = sqs.Queue(
            self,
            "Queue",
            visibility_timeout=ASSEMBLY_VISIBILITY,
            dead_letter_queue=sqs.DeadLetterQueue(
                queue=self.dead_letters, max_receive_count=limits.ASSEMBLER_MAX_RECEIVES
            ),
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
        )
        self.settings = settings.model_copy(update={"assembly_queue_url": self.queue.queue_url})
        self.function = lambdas.function(
            self,
            "Function",
            handler="functions.assembler.handler.handler",
            environment=self.settings.to_env(),
            description="Assembles a completed Upload's parts into its File (streamed, md5 checked)",
            memory_size=ASSEMBLER_MEMORY,
            timeout=ASSEMBLER_TIMEOUT,
        )
        self.function.add_event_source(
            sources.SqsEventSource(self.queue, batch_size=1, report_batch_item_failures=True)
        )
        storage.table.grant_read_write_data(self.function)
        storage.bucket.grant_read(self.function, UPLOAD_KEYS)
        storage.bucket.grant_delete(self.function, UPLOAD_KEYS)
        storage.bucket.grant_put(self.function, FILE_KEYS)
        acknowledge_data_grants(
            self.function.role,
            storage,
            {
                UPLOAD_KEYS: "Reads and deletes any tenant's upload parts and manifest (uploads/<tenant>/<upload>/), "
                "only under uploads/.",
                FILE_KEYS: "Writes the assembled file (files/<tenant>/<upload id>) of any tenant; only under files/.",
            },
            table="the assembler reads the Upload and settles its File by key.",
        )
        acknowledge_wildcards(
            self.function.role,
            {
                "Action::s3:DeleteObject*": "grant_delete's action group, on uploads/ keys only (parts and manifest "
                "once assembled).",
            },
        )

    def share_settings(self, functions: Iterable[lambda_.Function]) -> None:
        """Functions made before this construct (ingest's) get the queue's URL too, so every
        function's environment stays exactly the one ``Settings.to_env()``."""
        for function in functions:
            function.add_environment(Settings.env_name("assembly_queue_url"), self.queue.queue_url)

    def grant_dispatch(self, grantee: iam.IGrantable) -> None:
        """Who hands uploads to the assembler (the API's complete)."""
        self.queue.grant_send_messages(grantee)
