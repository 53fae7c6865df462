"""Audio lines (/v1/audio/transcriptions, /v1/audio/translations) at validation, shared by ingest
and run-batch (functions/core/lines.py ``check_audio_body``): the audio as ``file_url``, never
``file``; a data: URL's size by arithmetic; an http(s) URL's host on the allowlist; OpenAI's
optional fields typed. Each refusal's code, param and message."""

import base64

import pytest

from functions.core import limits
from functions.core.lines import LineError, check_request, data_url_size

TRANSCRIBE, TRANSLATE = limits.TRANSCRIPTIONS, limits.TRANSLATIONS
ALLOWED = ("media.example.com", "203.0.113.7")
WAV = "data:audio/wav;base64," + base64.b64encode(b"RIFF0000WAVE").decode()


def line(endpoint: str = TRANSCRIBE, **body):
    return {"custom_id": "a1", "method": "POST", "url": endpoint, "body": {"model": "whisper", **body}}


def refused(obj, endpoint: str = TRANSCRIBE) -> LineError:
    with pytest.raises(LineError) as error:
        check_request(obj, endpoint=endpoint, allowed_media_domains=ALLOWED)
    return error.value


@pytest.mark.parametrize(
    "url",
    [WAV, "https://media.example.com/a.wav?sig=1", "http://MEDIA.example.com:8080/a", "https://203.0.113.7/a.mp3"],
)
@pytest.mark.parametrize("endpoint", [TRANSCRIBE, TRANSLATE])
def test_an_audio_line_with_a_data_url_or_an_allowed_host_is_accepted(url, endpoint):
    assert check_request(line(endpoint, file_url=url), endpoint=endpoint, allowed_media_domains=ALLOWED) == (
        "a1",
        "whisper",
    )


def test_every_optional_field_of_openais_params_is_accepted():
    body = {
        "file_url": WAV,
        "language": "en",
        "prompt": "Names: Ada.",
        "response_format": "verbose_json",
        "temperature": 0,
        "timestamp_granularities": ["word", "segment"],
    }
    assert check_request(line(**body), endpoint=TRANSCRIBE) == ("a1", "whisper")


@pytest.mark.parametrize(
    ("body", "code", "param", "message"),
    [
        ({}, "missing_required_parameter", "body.file_url", "Missing required parameter: 'body.file_url'."),
        ({"file_url": 7}, "invalid_type", "body.file_url", "expected a string, but got 7"),
        ({"file": "a.wav", "file_url": WAV}, "invalid_value", "body.file", "'body.file' field is not supported"),
        ({"file_url": "ftp://media.example.com/a"}, "invalid_value", "body.file_url", "http, https or data"),
        ({"file_url": "file:///etc/passwd"}, "invalid_value", "body.file_url", "but it is 'file'"),
        ({"file_url": "media.example.com/a"}, "invalid_value", "body.file_url", "its scheme must be"),
        ({"file_url": "data:audio/wav,AAAA"}, "invalid_value", "body.file_url", "must be base64"),
        ({"file_url": "data:audio/wav;base64,AAA"}, "invalid_value", "body.file_url", "not valid base64"),
        ({"file_url": "data:audio/wav;base64,AA!A"}, "invalid_value", "body.file_url", "not valid base64"),
        ({"file_url": "data:audio/wav;base64,"}, "invalid_value", "body.file_url", "not valid base64"),
        ({"file_url": "https://evil.example.net/a"}, "invalid_value", "body.file_url", "not an allowed media domain"),
        ({"file_url": "https://x.media.example.com/a"}, "invalid_value", "body.file_url", "'x.media.example.com'"),
        ({"file_url": "http://169.254.169.254/latest"}, "invalid_value", "body.file_url", "the IP address"),
        ({"file_url": "http://[::1]/a"}, "invalid_value", "body.file_url", "the IP address '::1'"),
        ({"file_url": "https://u:p@media.example.com/a"}, "invalid_value", "body.file_url", "credentials"),
        ({"file_url": "https://media.example.com@evil.net/a"}, "invalid_value", "body.file_url", "credentials"),
        ({"file_url": "https://media.example.com\\@evil.net/"}, "invalid_value", "body.file_url", "backslashes"),
        ({"file_url": "https://media.example.com:99999/a"}, "invalid_value", "body.file_url", "not a valid URL"),
        ({"file_url": "https:///a"}, "invalid_value", "body.file_url", "no host"),
        ({"file_url": WAV, "language": 1}, "invalid_type", "body.language", "expected a string"),
        ({"file_url": WAV, "prompt": ["x"]}, "invalid_type", "body.prompt", "expected a string"),
        ({"file_url": WAV, "response_format": "mp3"}, "invalid_value", "body.response_format", "'verbose_json'"),
        ({"file_url": WAV, "temperature": "0.2"}, "invalid_type", "body.temperature", "expected a number"),
        ({"file_url": WAV, "temperature": True}, "invalid_type", "body.temperature", "expected a number"),
        ({"file_url": WAV, "temperature": 1.5}, "invalid_value", "body.temperature", "between 0 and 1"),
        (
            {"file_url": WAV, "timestamp_granularities": "word"},
            "invalid_type",
            "body.timestamp_granularities",
            "expected an array",
        ),
        (
            {"file_url": WAV, "timestamp_granularities": ["char"]},
            "invalid_value",
            "body.timestamp_granularities",
            "'char'",
        ),
    ],
)
def test_each_refusal_names_its_code_param_and_reason(body, code, param, message):
    error = refused(line(**body))
    assert (error.code, error.param) == (code, param)
    assert message in error.message


def test_timestamp_granularities_are_for_transcriptions_only():
    error = refused(line(TRANSLATE, file_url=WAV, timestamp_granularities=["word"]), TRANSLATE)
    assert (error.code, error.param) == ("invalid_value", "body.timestamp_granularities")
    assert "/v1/audio/transcriptions only" in error.message


def test_no_allowlist_accepts_only_data_urls_and_no_message_echoes_a_query():
    with pytest.raises(LineError) as error:
        check_request(line(file_url="https://media.example.com/a.wav?X-Amz-Signature=s3cr3t"), endpoint=TRANSCRIBE)
    assert "only data: URLs are accepted" in error.value.message and "s3cr3t" not in error.value.message
    assert check_request(line(file_url=WAV), endpoint=TRANSCRIBE) == ("a1", "whisper")


@pytest.mark.parametrize("audio", [b"a", b"ab", b"abc", b"abcd", bytes(range(256)) * 3])
def test_a_data_urls_size_is_its_decoded_length_and_one_byte_over_is_refused(audio):
    url = "data:audio/wav;base64," + base64.b64encode(audio).decode()
    assert data_url_size(url, max_bytes=len(audio)) == len(audio)
    with pytest.raises(LineError) as error:
        data_url_size(url, max_bytes=len(audio) - 1)
    assert f"its audio is {len(audio)} bytes; at most {len(audio) - 1}" in error.value.message


def test_a_data_url_over_the_audio_bound_is_refused_without_decoding_it():
    data = "A" * (4 * (limits.MAX_AUDIO_BYTES // 3 + 1))  # one block over 25 MiB
    error = refused(line(file_url="data:audio/wav;base64," + data))
    assert error.param == "body.file_url" and f"at most {limits.MAX_AUDIO_BYTES} are allowed" in error.message


def test_other_endpoints_bodies_are_not_checked_for_audio():
    chat = {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "file": 1}}
    assert check_request(chat, endpoint="/v1/chat/completions") == ("c", "m")
