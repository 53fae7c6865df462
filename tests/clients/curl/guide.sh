#!/usr/bin/env bash
# The curl commands of OpenAI's Batch guide (platform.openai.com/docs/guides/batch), as the guide
# writes them but for the host: $OPENAI_BASE_URL (e.g. http://127.0.0.1:8080/v1) where the guide
# has https://api.openai.com/v1, and the key from $OPENAI_API_KEY as there.
#
#   guide.sh upload              uploads ./batchinput.jsonl, prints the File
#   guide.sh create FILE_ID      creates a chat completions batch, prints the Batch
#   guide.sh retrieve BATCH_ID   prints the Batch
#   guide.sh results FILE_ID     writes the file's content to ./batch_output.jsonl
#   guide.sh cancel BATCH_ID     cancels the batch, prints the Batch
#   guide.sh list                prints the first 10 batches
#
# Run in the folder that holds batchinput.jsonl; tests/e2e/test_clients_e2e.py reads the answers.
set -euo pipefail
: "${OPENAI_BASE_URL:?set OPENAI_BASE_URL}" "${OPENAI_API_KEY:?set OPENAI_API_KEY}"
BASE=${OPENAI_BASE_URL%/}

case ${1:-} in
  upload)
    curl $BASE/files \
      -H "Authorization: Bearer $OPENAI_API_KEY" \
      -F purpose="batch" \
      -F file="@batchinput.jsonl"
    ;;
  create)
    curl $BASE/batches \
      -H "Authorization: Bearer $OPENAI_API_KEY" \
      -H "Content-Type: application/json" \
      -d '{
        "input_file_id": "'"$2"'",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h"
      }'
    ;;
  retrieve)
    curl $BASE/batches/$2 \
      -H "Authorization: Bearer $OPENAI_API_KEY" \
      -H "Content-Type: application/json"
    ;;
  results)
    curl $BASE/files/$2/content \
      -H "Authorization: Bearer $OPENAI_API_KEY" > batch_output.jsonl
    ;;
  cancel)
    curl $BASE/batches/$2/cancel \
      -H "Authorization: Bearer $OPENAI_API_KEY" \
      -H "Content-Type: application/json" \
      -X POST
    ;;
  list)
    curl "$BASE/batches?limit=10" \
      -H "Authorization: Bearer $OPENAI_API_KEY" \
      -H "Content-Type: application/json"
    ;;
  *)
    echo "usage: $0 {upload|create FILE_ID|retrieve BATCH_ID|results FILE_ID|cancel BATCH_ID|list}" >&2
    exit 2
    ;;
esac
