"""bespokelabs-curator's OpenAI batch backend against this Batch API, set up with only the base URL
and the key (``backend_params``), with structured output (a pydantic ``response_format``):

    .venv-clients/bin/python tests/clients/curator_batch.py BASE_URL KEY MODEL WORKING_DIR

Six reviews, two per batch (``batch_size``): curator uploads three input files, creates three
batches, polls them, downloads their outputs and parses each answer into ``Sentiment``. Prints one
JSON summary on stdout (the rows curator returned, its failed requests, the batches its status
tracker recorded) and exits 1 on any error; tests/e2e/test_clients_e2e.py asserts on
the summary.

Runs in the clients' venv (.venv-clients) with the offline settings of docs/clients.md:
``LITELLM_LOCAL_MODEL_COST_MAP=True`` (curator imports litellm, which otherwise fetches its cost
map at import), ``TELEMETRY_ENABLED=false`` (curator's posthog events), ``HF_HUB_OFFLINE=1`` and
``HF_DATASETS_OFFLINE=1`` (curator keeps its rows in a Hugging Face ``datasets`` cache)."""

import glob
import json
import os
import sys
from importlib.metadata import version
from typing import Literal

from bespokelabs import curator
from pydantic import BaseModel

REVIEWS = (
    "I loved this film, the best evening in years.",
    "Terrible food and a rude waiter. Never again.",
    "The phone works perfectly and the battery lasts for days.",
    "It broke after one day and support never answered.",
    "What a wonderful, friendly hotel with a great view.",
    "The worst book I have ever read, boring from start to end.",
)
PER_BATCH = 2


class Sentiment(BaseModel):
    """One answer: a schema the local model can always fill within a few tokens (the engine's
    guided decoding keeps its output to the schema's JSON)."""

    sentiment: Literal["positive", "negative"]


class Reviews(curator.LLM):
    response_format = Sentiment

    def prompt(self, row: dict) -> str:
        return f"Is this review positive or negative? Answer in JSON with the key sentiment.\nReview: {row['review']}"

    def parse(self, row: dict, response: Sentiment) -> dict:
        return {"review_id": row["review_id"], "sentiment": response.sentiment}


def main(base_url: str, key: str, model: str, working_dir: str) -> dict:
    llm = Reviews(
        model_name=model,
        backend="openai",
        batch=True,
        generation_params={"max_tokens": 16, "temperature": 0},
        backend_params={
            "base_url": base_url,
            "api_key": key,
            "batch_size": PER_BATCH,
            "batch_check_interval": 1,
            # Curator resubmits a batch's failed requests this many times; with 0 it never
            # records a failed batch as done (it counts attempts down from this).
            "max_retries": 1,
            "require_all_responses": True,
            "delete_successful_batch_files": False,
            "delete_failed_batch_files": False,
        },
    )
    rows = [{"review_id": i, "review": text} for i, text in enumerate(REVIEWS)]
    response = llm(rows, working_dir=working_dir)
    # Curator's own record of the batches it made (its status tracker, in the run's cache folder).
    batches = []
    for path in glob.glob(os.path.join(working_dir, "*", "batch_objects.jsonl")):
        with open(path) as handle:
            tracker = json.load(handle)
        batches += tracker["downloaded_batches"].values()
    return {
        "curator_version": version("bespokelabs-curator"),
        "openai_version": version("openai"),
        "rows": [dict(r) for r in response.dataset],
        "failed_requests": list(response.get_failed_requests()),
        "batches": [
            {
                "id": b["id"],
                "status": b["raw_status"],
                "request_counts": b["raw_batch"]["request_counts"],
                "input_file_id": b["raw_batch"]["input_file_id"],
                "output_file_id": b["raw_batch"]["output_file_id"],
            }
            for b in batches
        ],
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5]), default=str))
