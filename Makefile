# One place for every set-up and check. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of this version is what machines without a GPU get; an existing (CUDA) torch is kept.
TORCH_VERSION ?= 2.13.0
DEMO_DATA ?= data/demo

.PHONY: setup demo train-demo demo-data test test-all lint format bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@if [ ! -x $(BIN)/python ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "keeping the torch already installed: $$($(PYTHON) -c 'import torch; print(torch.__version__)')"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

$(DEMO_DATA)/meta.json: | $(VENV)/.installed
	$(BIN)/python -m trainer.data.demo_corpus --out $(DEMO_DATA)

demo-data: $(DEMO_DATA)/meta.json

# The main job: a small real ADAM-vs-LAMB experiment on CPU (SMAC3, SQLite), best config per optimizer.
# It has its own database (runs/demo/hpo.db), started afresh on every `make demo`.
demo: $(VENV)/.installed $(DEMO_DATA)/meta.json
	rm -rf runs/demo && mkdir -p runs/demo
	$(BIN)/hpo --db sqlite:///runs/demo/hpo.db run search_spaces/presets/adam_vs_lamb_demo_cpu.yaml \
	  --run-dir runs/demo/adam_vs_lamb_demo_cpu

# One pretraining run of the tiny BERT on CPU, without HPO.
train-demo: $(VENV)/.installed $(DEMO_DATA)/meta.json
	$(BIN)/python -m trainer --config trainer/configs/demo_cpu.yaml log.jsonl=runs/train-demo/metrics.jsonl

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

test: lint
	$(BIN)/python -m pytest

test-all: lint
	$(BIN)/python -m pytest -m "not gpu"

bench: $(VENV)/.installed
	$(BIN)/python bench/trainer_throughput.py
	$(BIN)/python bench/optimizer_step.py
	$(BIN)/python bench/load_balance.py
	$(BIN)/python -m bench.clipping_overhead
	$(BIN)/python bench/storage.py
	$(BIN)/python -m bench.controller_overhead

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
