"""Real speech made at test time: Debian's ``espeak-ng`` (``make test`` installs it) speaks a known
sentence into a WAV, which goes into a batch line as a ``data:`` URL. Speech recognition is
assessed by words, never by exact text."""

import base64
import re
import shutil
import subprocess

import pytest

#: What the English clip says, its words that carry meaning, and how many of them a transcript must
#: hold (tiny.en on espeak-ng's voice hears "free" for "three" at 22 kHz, "pizza and" for "pizzas").
SENTENCE = "Hello, my name is Alice. I would like to order three large pizzas for Friday evening."
KEY_WORDS = frozenset({"hello", "name", "alice", "order", "three", "large", "pizzas", "friday", "evening"})
ENOUGH = 6


def spoken_wav(text: str = SENTENCE, voice: str = "en-us") -> bytes:
    """``text`` spoken by espeak-ng as a WAV (22,050 Hz mono 16-bit, espeak-ng's own rate: the
    engine resamples it to Whisper's 16 kHz)."""
    program = shutil.which("espeak-ng")
    if program is None:
        pytest.fail("espeak-ng is not installed: apt-get install espeak-ng (make test installs it: make speech)")
    done = subprocess.run([program, "-v", voice, "-s", "150", "--stdout", text], capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout[:4] == b"RIFF", done.stderr
    return done.stdout


def data_url(wav: bytes) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav).decode()


def words(text: str) -> set[str]:
    """The lowercase words of ``text`` (punctuation dropped)."""
    return set(re.findall(r"[a-z]+", text.lower()))


def heard(text: str) -> set[str]:
    """The clip's key words a transcript holds."""
    return KEY_WORDS & words(text)


def understood(text: str) -> bool:
    """Whether a transcript holds enough of the clip's key words (``ENOUGH``)."""
    return len(heard(text)) >= ENOUGH
