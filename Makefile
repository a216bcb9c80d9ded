# speculant: `make demo` runs the default model, `make test` runs the test suite (what CI runs).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= Explain in three sentences why the sky is blue.

.PHONY: install demo test lint bench bench-spec

$(BIN)/speculant: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0   # the CPU wheel; never let a resolver pick a CUDA build
	$(BIN)/pip install -q -e ".[server,dev,bench]"
	$(BIN)/python -m speculant.kernels.native || echo "native kernels not built: the pure-torch kernels serve"
	touch $@

install: $(BIN)/speculant

demo: install
	$(BIN)/speculant generate --model smollm2-135m --chat --max-tokens 96 --prompt "$(PROMPT)"

test: install
	$(BIN)/speculant fetch smollm2-135m qwen2.5-coder-0.5b gemma3-270m
	$(BIN)/python -m pytest -q -ra

lint: install
	$(BIN)/ruff check speculant tests

bench: install
	$(BIN)/python -m speculant.bench.decode

bench-spec: install
	$(BIN)/python -m speculant.bench.spec
