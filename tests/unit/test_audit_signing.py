"""Checkpoint signatures (functions/core/signing.py): the local key file signs and its public key
verifies; a signature by another key, or over other bytes, does not; the key file is made once,
private to its owner, and names the same key id on every start."""

import stat

import pytest

from functions.core import anchor, signing
from tests.fakes.aws import KeySigner


def checkpoint(**over) -> anchor.Checkpoint:
    return anchor.Checkpoint(**{"tenant": "acme", "seq": 3, "hash": "a" * 64, "at": 1, "key_id": "k"} | over)


def test_the_key_file_signs_and_its_public_key_verifies(tmp_path):
    signer = signing.FileSigner(tmp_path / "key.pem")
    message = checkpoint().message()
    check = signing.verifier(signer.public_key())
    assert check(message, signer.sign(message))
    assert signing.public_key_der(signer.public_pem()) == signer.public_key()


def test_a_signature_by_another_key_or_over_other_bytes_is_rejected(tmp_path):
    signer = signing.FileSigner(tmp_path / "key.pem")
    check = signing.verifier(signer.public_key())
    message = checkpoint().message()
    assert not check(message, KeySigner().sign(message))
    assert not check(checkpoint(seq=4).message(), signer.sign(message))
    assert not check(message, b"\x30\x06\x02\x01\x01\x02\x01\x01")  # a well-formed DER signature of nothing


def test_a_signature_covers_the_checkpoint_context():
    """A signature the key made for anything else cannot pass as a checkpoint's."""
    signer = KeySigner()
    body = checkpoint().message().removeprefix(anchor.CHECKPOINT_CONTEXT)
    assert not signing.verifier(signer.public_key())(checkpoint().message(), signer.sign(body))


def test_the_key_file_is_made_once_private_and_keeps_its_key_id(tmp_path):
    path = tmp_path / "state" / "key.pem"
    first = signing.FileSigner(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = signing.FileSigner(path)
    assert again.key_id == first.key_id and again.key_id.startswith("local:")
    assert again.public_key() == first.public_key()


def test_only_a_p256_key_is_accepted(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    other = ec.generate_private_key(ec.SECP384R1())
    path = tmp_path / "p384.pem"
    path.write_bytes(
        other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    with pytest.raises(ValueError):
        signing.FileSigner(path)
    public = other.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(ValueError):
        signing.verifier(public)
