# The two set-up commands: `make demo` (runs the bundled examples end to end with the runtime
# dependencies only) and `make test` (installs the developer set-up: oracles, linters, servers).
# Both create .venv on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
# Reinstall when the package definition, the compiled kernels (pip builds migrator/core/kernels/*.c and
# kernels.h into migrator.core._kernels) or these install steps change.
BUILD_INPUTS := pyproject.toml setup.py $(sort $(wildcard migrator/core/kernels/*.[ch])) Makefile
BUILD_HASH := $(shell cat $(BUILD_INPUTS) | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-$(BUILD_HASH)
RUNTIME_STAMP := $(VENV)/.runtime-$(BUILD_HASH)
DEMO := demo-out

.PHONY: install install-runtime demo test test-fast test-llamacpp lint ubsan bench schema clean

install: $(STAMP)
	# Bytecode for the package, as a wheel install writes it: with PYTHONDONTWRITEBYTECODE set (it is
	# on this machine) an editable install otherwise recompiles every module on every run (~50 ms).
	$(PY) -m compileall -q migrator

# What a user installs (numpy, ml_dtypes, pydantic, PyYAML, rich): enough for `make demo`.
install-runtime: $(RUNTIME_STAMP)
	$(PY) -m compileall -q migrator

$(RUNTIME_STAMP): $(BUILD_INPUTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# compat mode puts the source folder on sys.path with a .pth line; the default editable finder is
	# imported by every Python start (~15 ms of each `migrate` run)
	$(PY) -m pip install --quiet -e . --config-settings editable_mode=compat
	rm -f $(VENV)/.runtime-*
	touch $@

$(STAMP): $(BUILD_INPUTS) $(RUNTIME_STAMP)
	# torch is pinned in the dev extra (2.13.0, the CPU build on this machine's disk) and installed
	# first, so that no oracle's own torch requirement (peft, mergekit) can pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]' --config-settings editable_mode=compat
	# deepspeed (the ZeRO checkpoints' writer and zero_to_fp32, the oracle of their reader) ships as an
	# sdist only: built against the torch above (--no-build-isolation, else pip fetches a CUDA torch to
	# build it) with no compiled ops; it runs on this CPU with DS_ACCELERATOR=cpu.
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --no-build-isolation deepspeed==0.19.8
	# Azurite, Azure's Blob service emulator (node), for tests/storage/test_azure.py's az:// tests on 127.0.0.1;
	# pinned, into the venv (git ignores it; the tests look there). Without npm those tests skip.
	# stdout is npm's package count only: errors still reach stderr.
	if command -v npm >/dev/null 2>&1; then \
		npm install --prefix $(VENV)/node --no-save --no-audit --no-fund --loglevel=error azurite@3.37.0 >/dev/null; fi
	# llama.cpp's convert_lora_to_gguf.py (and the conversion package, gguf-py it imports), the oracle of
	# tests/formats/test_gguf_lora.py: taken from the llama-cpp-python sdist test-llamacpp builds, nothing compiled
	$(MAKE) --no-print-directory $(LLAMACPP_SCRIPTS)/.extracted
	rm -f $(VENV)/.installed-*
	touch $@

LLAMACPP_VERSION := 0.3.36
LLAMACPP_SCRIPTS := $(VENV)/llamacpp-scripts-$(LLAMACPP_VERSION)
$(LLAMACPP_SCRIPTS)/.extracted:
	rm -rf $(LLAMACPP_SCRIPTS) && mkdir -p $(LLAMACPP_SCRIPTS)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: --dest $(LLAMACPP_SCRIPTS) \
		llama-cpp-python==$(LLAMACPP_VERSION)
	tar -xzf $(LLAMACPP_SCRIPTS)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP_SCRIPTS) \
		--strip-components=3 $(addprefix llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp/,\
		convert_lora_to_gguf.py convert_hf_to_gguf.py conversion gguf-py)
	rm -f $(LLAMACPP_SCRIPTS)/*.tar.gz
	touch $@

RECIPES := mlp-to-burn burn-to-safetensors-f16 encoder-surgery bert-to-burn burn-to-bert hf-folder-reshard \
	gpt2-split-qkv gpt2-merge-qkv mixtral-stack-experts mixtral-unstack-experts llama-meta-to-hf llama-hf-to-meta hf-llama-to-megatron \
	hf-qwen2-to-megatron hf-qwen3-to-megatron hf-mixtral-to-megatron hf-qwen3-moe-to-megatron \
	megatron-llama-to-hf megatron-qwen2-to-hf megatron-qwen3-to-hf megatron-mixtral-to-hf megatron-qwen3-moe-to-hf \
	bert-graft bert-cut-layers bert-stack-layers lora-fold merge-slerp merge-ties depth-upscale llama-to-burn \
	mixtral-prune-experts llama-add-tokens

demo: install-runtime
	rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(PY) recipes/generate_demo_data.py $(DEMO)
	$(VENV)/bin/migrate inspect $(DEMO)/tiny-bert.pt --rows 6
	$(VENV)/bin/migrate plan recipes/bert-to-burn.yaml
	$(VENV)/bin/migrate inspect $(DEMO)/tiny-bert-hf --rows 4
	for r in $(RECIPES); do $(VENV)/bin/migrate run recipes/$$r.yaml --no-progress || exit 1; done
	$(VENV)/bin/migrate validate $(addprefix recipes/,$(addsuffix .yaml,$(RECIPES)))
	$(PY) recipes/check_round_trip.py $(DEMO)/tiny-bert.safetensors $(DEMO)/tiny-bert-roundtrip.safetensors \
		embeddings.position_ids
	$(VENV)/bin/migrate convert $(DEMO)/tiny-bert.bpk $(DEMO)/tiny-bert-copy.bpk
	cmp $(DEMO)/tiny-bert.bpk $(DEMO)/tiny-bert-copy.bpk && echo "burnpack -> burnpack convert: byte-identical"
	ls $(DEMO)/tiny-bert-resharded
	$(VENV)/bin/migrate plan recipes/mixtral-stack-experts.yaml
	$(PY) recipes/check_round_trip.py $(DEMO)/gpt2-tiny.safetensors $(DEMO)/gpt2-tiny-merged.safetensors
	$(PY) recipes/check_round_trip.py $(DEMO)/mixtral-tiny-experts.safetensors $(DEMO)/mixtral-tiny-experts-again.safetensors
	$(PY) recipes/check_round_trip.py $(DEMO)/llama-meta-tiny/consolidated.00.pth $(DEMO)/llama-meta-tiny-again.pt
	$(PY) recipes/check_round_trip.py $(DEMO)/llama-hf-tiny/model.safetensors $(DEMO)/llama-megatron-hf/model.safetensors
	for m in qwen2 qwen3 qwen3-moe mixtral; do $(PY) recipes/check_round_trip.py $(DEMO)/$$m-tiny-hf/model.safetensors \
		$(DEMO)/$$m-megatron-hf/model.safetensors || exit 1; done

# The suite in TEST_JOBS processes (pytest-xdist; 0 runs it in this process). Tests share no files
# or fixed paths, and --dist loadfile keeps each file's tests, and its module fixtures, in one worker.
TEST_JOBS ?= 2
test: lint
	$(VENV)/bin/pytest -q -n $(TEST_JOBS) --dist loadfile

# The tests that need no oracle and no server, and are not marked slow: tests/conftest.py reads each test
# file's imports (and those of the tests/ helpers it uses) and leaves out, without importing them, the
# files that import torch, transformers, peft, mergekit, gguf, deepspeed, ray or an object store.
test-fast: lint
	$(VENV)/bin/pytest -q -n $(TEST_JOBS) --dist loadfile --fast

# llama.cpp as an oracle of the GGUF files migrator writes (optional; not part of `make test`):
# llama-cpp-python compiles llama.cpp from source (CPU only, no BLAS/OpenMP/CURL, no tools or
# examples; ~20 min on 2 busy cores), once, into $(LLAMACPP), a folder of its own that only this target
# puts on sys.path, so `make test` and CI never see it. --no-deps: its requirements (numpy,
# typing-extensions, jinja2) are in the dev set-up already, diskcache is pinned beside it.
LLAMACPP ?= $(VENV)/llamacpp-$(LLAMACPP_VERSION)
LLAMACPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF \
	-DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF
test-llamacpp: install $(LLAMACPP)/.built
	PYTHONPATH=$${PYTHONPATH:+$$PYTHONPATH:}$(abspath $(LLAMACPP)) $(VENV)/bin/pytest -q -n 0 -s -m llamacpp \
		tests/formats/test_gguf_llamacpp.py

$(LLAMACPP)/.built:
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(PY) -m pip install --quiet --no-deps \
		--target $(LLAMACPP) llama-cpp-python==$(LLAMACPP_VERSION) diskcache==5.6.3
	touch $@

# ruff, then mypy on the package ([tool.mypy] in pyproject.toml: no errors, no unused `type: ignore`);
# a cold mypy run takes ~5 s of CPU here, a warm one (.mypy_cache) well under a second
lint: install
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# The kernels built with UndefinedBehaviorSanitizer and AddressSanitizer (any finding aborts) into
# build/ubsan, beside a copy of the package, and the tests of each kernel file (casts, stats, GGUF
# blocks and K-quants, merges, LoRA deltas, quantized checkpoints' bands, FP8 quantization) run against that
# copy. ASan must be the first library loaded into the (uninstrumented) Python: LD_PRELOAD; leak checks would
# report Python's own
# allocations. libstdc++ is preloaded beside it: ASan wraps __cxa_throw only if the C++ runtime is
# loaded when it starts, and torch (imported by a GGUF test) throws while importing.
UBSAN := build/ubsan
SANITIZE := -fsanitize=undefined,address -fno-sanitize-recover=all -fno-omit-frame-pointer -g
ubsan: install
	rm -rf $(UBSAN) && mkdir -p $(UBSAN)/tmp
	cp -r migrator $(UBSAN)/ && rm -f $(UBSAN)/migrator/core/_kernels*.so
	CFLAGS="$(SANITIZE)" LDFLAGS="$(SANITIZE)" $(PY) setup.py -q build_ext --build-lib $(UBSAN) --build-temp $(UBSAN)/tmp
	cd $(UBSAN) && LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libstdc++.so.6)" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
		MIGRATOR_SHARED_FIXTURES=$(CURDIR)/../shared/fixtures PYTHONPATH=$(CURDIR)/$(UBSAN) \
		$(PY) -m pytest -q --capture=sys -p no:cacheprovider --rootdir=$(CURDIR) $(CURDIR)/tests/core/test_kernels.py $(CURDIR)/tests/core/test_kernels_merge.py \
		$(CURDIR)/tests/core/test_casts.py \
		$(CURDIR)/tests/analysis/test_stats.py $(CURDIR)/tests/analysis/test_diff.py \
		$(CURDIR)/tests/formats/test_gguf_quants.py $(CURDIR)/tests/formats/test_gguf_kquants.py \
		$(CURDIR)/tests/transform/test_merging_kernels.py $(CURDIR)/tests/transform/test_lora_product.py \
		$(CURDIR)/tests/core/test_dequant.py $(CURDIR)/tests/core/test_fp8_quantize.py

bench: install
	$(PY) benchmarks/suite.py

schema: install
	$(PY) tools/gen_schema.py

clean:
	rm -rf $(DEMO) benchmarks/out .pytest_cache .ruff_cache
