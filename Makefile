# One place for every set-up and check. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The torch the set-up installs when the python3 it starts from has none (an existing one, a CUDA build say, is
# kept): this version from the package index pip is configured with. PyPI's Linux build bundles CUDA (several GB);
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu takes the CPU build instead.
TORCH_VERSION ?= 2.13.0
TORCH_INDEX_URL ?=
DEMO_DATA ?= data/demo

.PHONY: setup system-deps bench-deps demo train-demo demo-data test test-all fuzz lint docs format bench clean

# Debian packages the tests use: docker-compose validates docker-compose.yml, chromium renders pages headless.
DEBIAN_PACKAGES ?= docker-compose chromium
# Installed only when missing (needs root or sudo; on other systems install them with your package manager).
system-deps:
	@missing=""; for p in $(DEBIAN_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# Debian packages only the benchmarks use: wrk drives the REST API in bench/api_load.py.
BENCH_DEBIAN_PACKAGES ?= wrk
# Python packages only the benchmarks use: Syne Tune, a peer in bench/cost_at_scale/. Installed without their
# declared dependencies: syne-tune 0.16 requires xgboost, whose Linux wheel requires nvidia-nccl-cu12 (a 350 MB wheel
# for multi-GPU training, never loaded here). ASHA, TPE and the simulator backend need none of it; CQR imports xgboost
# (installed, without NCCL). What they do need (numpy, pandas, scikit-learn, tqdm, psutil, sortedcontainers) is in the
# dev install; dill and statsmodels come with their own (small) dependencies.
BENCH_PYTHON_PACKAGES ?= dill statsmodels
BENCH_NO_DEPS_PACKAGES ?= syne-tune==0.16.0 xgboost==3.2.0
bench-deps: $(VENV)/.installed
	@$(MAKE) --no-print-directory system-deps DEBIAN_PACKAGES="$(BENCH_DEBIAN_PACKAGES)"
	$(BIN)/python -m pip install -q $(BENCH_PYTHON_PACKAGES)
	$(BIN)/python -m pip install -q --no-deps $(BENCH_NO_DEPS_PACKAGES)

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "hpo needs Python 3.11 or later; $(PYTHON) is $$($(PYTHON) --version 2>&1 || echo missing): give another with PYTHON=python3.11 (make $(MAKECMDGOALS) PYTHON=...)" >&2; exit 2; }
	@if [ ! -x $(BIN)/python ]; then \
	  if $(PYTHON) -c "import torch" 2>/dev/null; then \
	    echo "keeping the torch already installed: $$($(PYTHON) -c 'import torch; print(torch.__version__)')"; \
	    $(PYTHON) -m venv --system-site-packages $(VENV); \
	  else \
	    $(PYTHON) -m venv $(VENV); \
	  fi; \
	fi
	$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==$(TORCH_VERSION) \
	  $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m hpo.nni.patch  # NNI 3.0's manager mixes up trials' parameters; idempotent
	@touch $@

$(DEMO_DATA)/meta.json: | $(VENV)/.installed
	$(BIN)/python -m trainer.data.demo_corpus --out $(DEMO_DATA)

demo-data: $(DEMO_DATA)/meta.json

# The main job: a small real ADAM-vs-LAMB experiment on CPU (SMAC3, SQLite), best config per optimizer, re-run
# in rounds of 3 more seeds each (at most 6) until the verdict decides. Trials are bounded by samples; sized to end
# within 10 minutes when idle.
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

# The documentation site (MkDocs, Material theme) from docs/ into site/; --strict fails on a broken link or a page
# missing from the navigation.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Two workers (the machines have two cores; most tests wait on subprocesses, servers and databases), a test file per
# worker so that a module's fixtures are built once; `pytest` alone runs the same tests in one process.
test: lint docs system-deps
	$(BIN)/python -m pytest -n 2 --dist loadfile

test-all: lint
	$(BIN)/python -m pytest -m "not gpu"

# `make test` draws fixed examples (the derandomized Hypothesis profile `ci`); this explores new seeds, with more
# examples, in every Hypothesis/schemathesis test. A failure prints its seed: `make fuzz SEED=N` replays it.
SEED ?=
fuzz: $(VENV)/.installed
	$(BIN)/python -m pytest -m hypothesis --hypothesis-profile=fuzz $(if $(SEED),--hypothesis-seed=$(SEED))

bench: $(VENV)/.installed bench-deps
	$(BIN)/python bench/trainer_throughput.py
	$(BIN)/python bench/optimizer_step.py
	$(BIN)/python bench/load_balance.py
	$(BIN)/python -m bench.clipping_overhead
	$(BIN)/python bench/storage.py
	$(BIN)/python -m bench.controller_overhead
	$(BIN)/python -m bench.controller_overhead --trials 40 --only local --only nni
	$(BIN)/python -m bench.noise_scale_overhead
	$(BIN)/python -m bench.api_load --trials 100000
	$(BIN)/python -m bench.report

clean:
	rm -rf $(VENV) runs site .pytest_cache .ruff_cache
