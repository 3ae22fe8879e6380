# Everyday commands. `make demo` and `make test` are the README's two commands; .ci/run calls `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/tokenfront
PORT ?= 8000
# The peer the render benchmark measures against: vLLM 0.33's CPU render server, in a venv of its own.
VLLM_PEER ?= $(HOME)/.cache/tokenfront-peers/vllm
RENDER_PORT ?= 8100

.PHONY: install install-test fixtures demo demo-render test test-fast lint format bench bench-http bench-router \
	bench-prefill bench-routing bench-robustness bench-kv-decision bench-connections bench-health-latency \
	bench-simulated-fleet bench-fleet bench-startup peer-vllm compare-vllm compare-vllm-protocol compare-vllm-kv-events clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Installed as a built wheel, never editable: the wheel holds the render hot path compiled by mypyc (setup.py), and
# the tests run on what ships. pip rebuilds and reinstalls the project each time (about 15 s), so every target
# below runs the current source; tests/conftest.py stops a run whose installed copy differs from src/.
install: $(BIN)/python
	$(BIN)/python -m pip install --quiet .

install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet '.[test,worker]'
	@command -v jq >/dev/null || (apt-get update -qq && apt-get install -y -qq jq) || echo "jq not installed: the shell recipe test will be skipped"
	@(test -x /usr/bin/chromium && test -x /usr/bin/chromedriver) || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) \
		|| echo "chromium not installed: the inspector's browser test will be skipped"
# promtool and prometheus, for tests/monitoring/ (the alerting rules, and a real Prometheus scraping real servers)
	@command -v promtool >/dev/null || (apt-get update -qq && apt-get install -y -qq prometheus) \
		|| echo "prometheus not installed: the monitoring tests will be skipped (under CI they fail)"
# dnsmasq, the real DNS server tests/router/test_router_worker_sources.py starts for the router's --worker-dns
	@(command -v dnsmasq >/dev/null || test -x /usr/sbin/dnsmasq) || (apt-get update -qq && apt-get install -y -qq dnsmasq-base) \
		|| echo "dnsmasq not installed: the DNS source tests will be skipped (under CI they fail)"

fixtures: install
	$(BIN)/tokenfront fixtures

# Set up and run the main job: a worker on the real SmolLM2-135M-Instruct (fetched and converted by the
# project's fixture script), with the render endpoints mounted too, on http://127.0.0.1:$(PORT).
demo: $(BIN)/python
	$(BIN)/python -m pip install --quiet '.[worker]'
	$(BIN)/tokenfront fixtures --only smollm2
	TOKENFRONT_ENABLE_RENDER_ENDPOINTS=1 $(BIN)/tokenfront serve --model $(CACHE)/checkpoints/smollm2 \
		--served-model-name SmolLM2-135M-Instruct --tool-call-parser hermes --port $(PORT)

# The CPU renderer alone (no torch), on the real Qwen3 tokenizer and chat template.
demo-render: install
	$(BIN)/tokenfront fixtures --only qwen3
	$(BIN)/tokenfront render --model $(CACHE)/checkpoints/qwen3 --served-model-name Qwen3-0.6B \
		--reasoning-parser qwen3 --port $(RENDER_PORT)

# Set up and run every test (fixtures are fetched by the project's own script and cached).
test: install-test
	$(BIN)/tokenfront fixtures
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

test-fast: install-test
	$(BIN)/python -m pytest -q -m "not slow"

lint:
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/ruff format --check src tests benchmarks

format:
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

bench: install-test
	$(BIN)/python -m benchmarks.render

# tokenfront render against vLLM's CPU render server over HTTP, in one run (vLLM when `make peer-vllm` ran).
bench-http: install-test
	$(BIN)/python -m benchmarks.render_http --workers 1,2 $(if $(wildcard $(VLLM_PEER)/bin/vllm),--vllm $(VLLM_PEER) --vllm-rs $(VLLM_PEER))

# Same requests, same ids? gpt-oss (Harmony) and Mistral (tekken, mistral-common) rendered by tokenfront and by
# vLLM 0.33's render server side by side (needs `make peer-vllm`; not CI).
compare-vllm: install-test
	$(BIN)/tokenfront fixtures --only gptoss gptoss-bare mistral-tekken
	$(BIN)/python -m benchmarks.compare_vllm --vllm $(VLLM_PEER)

# /tokenize, /detokenize, Anthropic and Responses render, chat and completions derender: tokenfront and vLLM
# 0.33's render server on Qwen3 (qwen3 reasoning, hermes tools), case by case (needs `make peer-vllm`; not CI).
compare-vllm-protocol: install-test
	$(BIN)/tokenfront fixtures --only qwen3
	$(BIN)/python -m benchmarks.compare_vllm_protocol --vllm $(VLLM_PEER)

# A tokenfront worker's ZMQ KV events decoded by vLLM 0.33's own KVEventBatch decoder (needs `make peer-vllm`; not CI).
compare-vllm-kv-events: install-test
	$(BIN)/tokenfront fixtures --only qwen3
	$(BIN)/python -m benchmarks.compare_vllm_kv_events --vllm $(VLLM_PEER)

# The router's own added latency over a direct worker call.
bench-router: install-test
	$(BIN)/python -m benchmarks.router_overhead

# Once per machine, never in CI: about 10 minutes and 9 GB.
peer-vllm:
	$(PYTHON) -m venv $(VLLM_PEER)
	$(VLLM_PEER)/bin/pip install vllm==0.33.0

bench-prefill: install-test
	$(BIN)/python -m benchmarks.prefill

bench-routing: install-test
	$(BIN)/python -m benchmarks.routing

# Load and faults: the renderer under 256 connections, a router fleet losing a worker, a router restart.
bench-robustness: install-test
	$(BIN)/tokenfront fixtures --only qwen3 tiny-random
	$(BIN)/python -m benchmarks.robustness

# The KV index in-process: decision p50/p99 (hashing included), events applied per second, bytes per held block.
bench-kv-decision: install-test
	$(BIN)/python -m benchmarks.kv_decision
	$(BIN)/python -m benchmarks.kv_decision --policy predicted_ttft --workers 1000

# One renderer holding 10,000 idle or silent connections, slow-loris and huge headers; the protocol's cost.
bench-connections: install-test
	$(BIN)/tokenfront fixtures --only qwen3
	$(BIN)/python -m benchmarks.connections

# `tokenfront render` launched as `make demo-render` starts it: seconds to a 200 on /health and idle RSS, beside
# vLLM's Rust renderer when `make peer-vllm` ran.
bench-startup: install-test
	$(BIN)/tokenfront fixtures --only qwen3
	$(BIN)/python -m benchmarks.startup --runs 5 $(if $(wildcard $(VLLM_PEER)/bin/vllm),--vllm-rs $(VLLM_PEER))

# /health latency while the largest request each limit allows is served (renderer, worker, router).
bench-health-latency: install-test
	$(BIN)/tokenfront fixtures --only smollm2
	$(BIN)/python -m benchmarks.health_latency

# A fleet of simulated GPU workers in one process and in two: start-up, idle and loaded CPU and RSS at 64 and 256
# workers.
bench-simulated-fleet: install-test
	$(BIN)/tokenfront fixtures --only qwen3
	$(BIN)/python -m benchmarks.simulated_fleet --workers 64,256 --processes 1,2

# Routing policies on a simulated fleet at load 0.7 of the agentic workload: live at 64 workers (real servers),
# offline on the virtual clock at 1,000 (docs/routing.md). Live at the default clock, 0.1: 256 live workers need more than 2 cores.
bench-fleet: install-test
	$(BIN)/tokenfront fixtures --only qwen3
	$(BIN)/python -m benchmarks.fleet --workers 64 --load 0.7 --duration 30
	$(BIN)/python -m benchmarks.fleet --offline --workers 1000 --load 0.7 --duration 20

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
