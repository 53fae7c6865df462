"""A stand-in for gpu_worker/engine/serve.sh in run-batch's ``--model`` tests: a tiny HTTP server
on 127.0.0.1:PORT answering /health and /v1/embeddings, started as
``python serve_engine.py PORT MODE STATE_DIR``.

MODE ``ok``: healthy after 0.5 s; ``die``: prints a few log lines and exits 3 before it is ever
healthy. Either way it first starts a child (``sleep``) in its own process group and writes both
pids to STATE_DIR/pids, so a test can check that stopping the engine reaches the whole group."""

import http.server
import json
import subprocess
import sys
import time
from pathlib import Path

port, mode, state = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
child = subprocess.Popen(["sleep", "300"])
(state / "pids").write_text(f"{child.pid}\n")
print("fake engine: loading weights", flush=True)
if mode == "die":
    print("fake engine: out of memory while loading", flush=True)
    sys.exit(3)
time.sleep(0.5)


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200 if self.path == "/health" else 404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = {
            "id": "embd-1",
            "object": "list",
            "created": 0,
            "model": body.get("model", ""),
            "data": [{"index": 0, "object": "embedding", "embedding": [0.5, 0.5]}],
            "usage": {"prompt_tokens": 2, "total_tokens": 2},
        }
        self.reply(200 if self.path == "/v1/embeddings" else 404, answer)


http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
