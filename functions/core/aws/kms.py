"""KMS: the ``Signer`` port on an asymmetric KMS key (ECC_NIST_P256, SIGN_VERIFY), with which the
audit appender signs checkpoints (``functions.core.anchor``). The private key never leaves KMS;
``kms:Sign`` is the appender's alone, ``kms:GetPublicKey`` whoever verifies (docs/audit.md)."""

from typing import Any

from ..anchor import SIGNING_ALGORITHM
from .errors import translate


class KmsSigner:
    def __init__(self, kms: Any, key_id: str):
        self._kms, self.key_id = kms, key_id

    def sign(self, message: bytes) -> bytes:
        # RAW: KMS hashes the message (at most 4,096 bytes; a checkpoint is about 300).
        with translate():
            return self._kms.sign(
                KeyId=self.key_id, Message=message, MessageType="RAW", SigningAlgorithm=SIGNING_ALGORITHM
            )["Signature"]

    def public_key(self) -> bytes:
        with translate():
            return self._kms.get_public_key(KeyId=self.key_id)["PublicKey"]
