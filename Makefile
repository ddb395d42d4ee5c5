# byok — `make run` starts the daemon, `make test` runs the whole suite.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# `make run` needs only byok's runtime dependencies; the test and dev extras come with `make test`.
RUN_STAMP := $(VENV)/.installed-run

.PHONY: run test proto bench lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(RUN_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e .
	touch $(RUN_STAMP)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[test,dev]'
	touch $(STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)
	$(BIN)/byok serve

# tests/integration/test_service.py checks the systemd unit `byok service install` writes with
# systemd-analyze (Debian's systemd package); installed here when apt-get can.
# tests/browser drives Debian's chromium with Playwright (never a downloaded browser): installed
# here when it is missing (where there is no apt-get, those tests say they are skipped).
test: $(STAMP)
	command -v systemd-analyze >/dev/null || { command -v apt-get >/dev/null && \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd; } || true
	test -x /usr/bin/chromium || ! command -v apt-get >/dev/null || { apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
	$(BIN)/ruff check byok tests tools
	$(BIN)/python -m pytest -q tests --ignore=tests/bench

bench: $(STAMP)
	$(BIN)/python -m pytest -q tests/bench -s

# byok against LiteLLM's proxy in one run, in front of the same fake provider (not part of `make test`
# or `make bench`): LiteLLM goes into a virtualenv of its own, outside the project's dependencies.
# Results are recorded in docs/performance.md.
PEERS_VENV ?= .venv-peers
.PHONY: bench-peers
bench-peers: $(STAMP)
	$(BIN)/python -m tools.bench_peers --venv $(PEERS_VENV)

# Long fuzz run, not part of `make test`: the properties of tests/fuzz with FUZZ_EXAMPLES examples
# per target (30 targets x 40,000 ~ 1.2 x 10^6). Results are recorded in docs/fuzzing.md.
FUZZ_EXAMPLES ?= 40000
.PHONY: fuzz
fuzz: $(STAMP)
	BYOK_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q tests/fuzz --hypothesis-show-statistics

lint: $(STAMP)
	$(BIN)/ruff check byok tests tools

# Regenerates byok/pb from proto/ (tests/unit/test_pb_fresh.py fails when it is stale).
proto: $(STAMP)
	rm -rf byok/pb && mkdir -p byok/pb
	PATH=$(abspath $(BIN)):$$PATH $(BIN)/python -m grpc_tools.protoc -I proto \
		--python_betterproto2_out=byok/pb --python_betterproto2_opt=client_generation=none \
		proto/agent_v1.proto proto/aiserver_v1.proto proto/agent_service.proto proto/bidi_service.proto

clean:
	rm -rf $(VENV)
