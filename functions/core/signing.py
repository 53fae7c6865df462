"""ECDSA P-256 signatures with SHA-256 (KMS's ``ECDSA_SHA_256``; DER-encoded), for the audit
checkpoints (``functions.core.anchor``): ``verifier`` checks a signature with a public key, the
same code for KMS's keys and the local one; ``FileSigner`` is the ``Signer`` port on a key file,
the local deployment's stand-in for the KMS key (``functions.core.aws.kms.KmsSigner``).

Uses the ``cryptography`` package (the local deployment and batchctl have it; the Lambdas on AWS
sign with KMS and never import this module)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from .anchor import SignatureCheck

#: How a local key names itself in a checkpoint: ``local:`` + the first hex digits of its public key's sha256.
LOCAL_KEY_ID_HEX = 16


def verifier(public_key_der: bytes) -> SignatureCheck:
    """A check of (message, DER signature) against the P-256 ``public_key_der``
    (SubjectPublicKeyInfo, as KMS GetPublicKey returns it)."""
    key = serialization.load_der_public_key(public_key_der)
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("the audit signing key must be an ECC_NIST_P256 key")

    def check(message: bytes, signature: bytes) -> bool:
        try:
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True

    return check


def public_key_der(pem: bytes) -> bytes:
    """A PEM public key (``FileSigner.public_pem``) as DER SubjectPublicKeyInfo."""
    return serialization.load_pem_public_key(pem).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def public_key_pem(der: bytes) -> bytes:
    """A DER public key as PEM (what ``--public-key`` reads)."""
    return serialization.load_der_public_key(der).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


class FileSigner:
    """The ``Signer`` port on a PEM private key file (created on first use, mode 0600)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise ValueError(f"{path}: the audit signing key must be an ECDSA P-256 key")
        self._key = key
        self.key_id = f"local:{hashlib.sha256(self.public_key()).hexdigest()[:LOCAL_KEY_ID_HEX]}"

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message, ec.ECDSA(hashes.SHA256()))

    def public_key(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def public_pem(self) -> bytes:
        return public_key_pem(self.public_key())
