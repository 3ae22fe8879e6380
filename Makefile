# Everyday commands. `make demo` and `make test` are the README's two commands; .ci/run calls `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/tokenfront
PORT ?= 8000
RENDER_PORT ?= 8100

.PHONY: install install-test fixtures demo demo-render test test-fast lint format bench bench-prefill bench-routing clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .

install-test: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test,worker]'
	@command -v jq >/dev/null || (apt-get update -qq && apt-get install -y -qq jq) || echo "jq not installed: the shell recipe test will be skipped"

fixtures: install
	$(BIN)/tokenfront fixtures

# Set up and run the main job: a worker on the real SmolLM2-135M-Instruct (fetched and converted by the
# project's fixture script), with the render endpoints mounted too, on http://127.0.0.1:$(PORT).
demo: $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[worker]'
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

bench-prefill: install-test
	$(BIN)/python -m benchmarks.prefill

bench-routing: install-test
	$(BIN)/python -m benchmarks.routing

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .ruff_cache
