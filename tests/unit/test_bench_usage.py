"""The benchmarks' sums over an output file's usage (tests/bench/bench_worker.py)."""

from tests.bench.bench_worker import cached_tokens, output_tokens


def _answered(completion: int, details: dict | None) -> dict:
    usage = {"prompt_tokens": 300, "completion_tokens": completion, "total_tokens": 300 + completion}
    if details is not None:
        usage["prompt_tokens_details"] = details
    return {"custom_id": "x", "response": {"status_code": 200, "body": {"usage": usage}}, "error": None}


def test_cached_tokens_sum_what_the_answered_lines_took_from_the_prefix_cache():
    lines = [
        _answered(64, {"cached_tokens": 256}),
        _answered(64, {"cached_tokens": 0}),
        _answered(64, None),  # an engine started without --enable-prompt-tokens-details
        _answered(64, {"cached_tokens": None}),
        {
            "custom_id": "y",
            "response": {"status_code": 400, "body": {"usage": {"prompt_tokens_details": {"cached_tokens": 99}}}},
        },
        {"custom_id": "z", "response": None, "error": {"code": "x", "message": "y"}},
    ]
    assert cached_tokens(lines) == 256
    assert output_tokens(lines[:4]) == 256
