"""Audio batches through the deployment with a real speech model (locally Whisper tiny.en on the CPU
build of vLLM; docs/engine.md, "Speech"), driven by the official openai SDK: real speech made at
test time (espeak-ng, ``tests/speech.py``) as a ``data:`` URL in ``/v1/audio/transcriptions`` and
``/v1/audio/translations`` lines, the words back in bodies that validate as the SDK's own
``Transcription``, ``TranscriptionVerbose`` and ``Translation``, and usage as for any line.

The SDK's ``batches.create`` types ``endpoint`` as a Literal of OpenAI's batch endpoints; it sends
any string, so the audio endpoints go as they are."""

import json

import pytest
from openai import OpenAI
from openai.types.audio import Transcription, TranscriptionVerbose, Translation

from tests import speech

from .test_batches_e2e import check_invariants, sdk, submit, wait

pytestmark = [pytest.mark.e2e, pytest.mark.engine, pytest.mark.slow]


def audio_line(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def test_spoken_english_comes_back_as_words_in_transcription_and_translation_batches(sdk: OpenAI, speech_model: str):
    clip = speech.data_url(speech.spoken_wav())
    transcriptions = [
        audio_line("t-json", "/v1/audio/transcriptions", {"model": speech_model, "file_url": clip}),
        audio_line(
            "t-verbose",
            "/v1/audio/transcriptions",
            {"model": speech_model, "file_url": clip, "response_format": "verbose_json", "language": "en"},
        ),
    ]
    translations = [audio_line("tr-json", "/v1/audio/translations", {"model": speech_model, "file_url": clip})]
    created = [
        submit(sdk, transcriptions, endpoint="/v1/audio/transcriptions"),
        submit(sdk, translations, endpoint="/v1/audio/translations"),
    ]
    done = [wait(sdk, batch.id, timeout=300) for batch in created]
    assert [b.status for b in done] == ["completed", "completed"], done

    out, err = check_invariants(sdk, done[0], [r["custom_id"] for r in transcriptions])
    assert err == [] and [r.response.status_code for r in out] == [200, 200], out
    plain = Transcription.model_validate(out[0].response.body)  # the SDK's own types
    # vLLM computes no segment's no_speech_prob (null where OpenAI's type has a number; docs/api.md,
    # "Audio lines"): every other field validates as the SDK's.
    body = out[1].response.body
    assert {segment["no_speech_prob"] for segment in body["segments"]} == {None}, body
    verbose = TranscriptionVerbose.model_validate(
        {**body, "segments": [{**segment, "no_speech_prob": 0.0} for segment in body["segments"]]}
    )
    assert speech.understood(plain.text) and speech.understood(verbose.text), (plain.text, verbose.text)
    assert verbose.segments and verbose.duration > 3 and verbose.language.lower() in ("en", "english"), verbose
    assert plain.usage is not None and plain.usage.type == "duration" and plain.usage.seconds > 3, plain.usage

    (translated,), err = check_invariants(sdk, done[1], ["tr-json"])
    assert err == [] and translated.response.status_code == 200, translated
    assert speech.understood(Translation.model_validate(translated.response.body).text), translated


def test_an_audio_line_whose_url_the_deployment_does_not_allow_fails_the_batch_at_validation(
    sdk: OpenAI, speech_model: str
):
    """The deployment's media allowlist (empty by default: ``data:`` URLs only) is applied at
    ingest: a line naming the metadata address never reaches a worker, and the batch fails with
    the line's error as every invalid line's."""
    rows = [
        audio_line(
            "meta",
            "/v1/audio/transcriptions",
            {"model": speech_model, "file_url": "http://169.254.169.254/latest/meta-data/audio.wav"},
        )
    ]
    batch = wait(sdk, submit(sdk, rows, endpoint="/v1/audio/transcriptions").id, timeout=120)
    assert batch.status == "failed", batch
    assert batch.errors is not None and batch.errors.data, batch
    error = batch.errors.data[0]
    assert error.line == 1 and error.param and "file_url" in error.param, json.dumps(batch.errors.model_dump())
