# ptm_app: `make demo` runs the main job, `make test` the test suite; both set everything up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := constraints-cpu.txt
STAMP := $(VENV)/.installed
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1

.PHONY: setup data demo test test-slow test-all clean-runs

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip -c $(CONSTRAINTS)
	$(PIP) install -q -c $(CONSTRAINTS) torch==2.13.0
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

data: setup
	$(PY) main.py data prepare

# The main job: MLM continued pre-training of MiniLM on BBC articles, export, fine-tuning on BBC
# topics from that checkpoint, then the test metrics of the best checkpoint.
demo: data
	$(PY) main.py fit --config configs/demo/mlm_minilm_bbc.yaml
	$(PY) main.py export --ckpt_path checkpoints/demo_mlm --output_dir checkpoints/demo_mlm/export
	$(PY) main.py fit --config configs/demo/finetune_bbc.yaml
	$(PY) main.py test --config configs/demo/finetune_bbc.yaml --ckpt_path best

test: data
	$(PY) -m pytest -q

test-slow: data
	$(PY) -m pytest -q -m slow

test-all: data
	$(PY) -m pytest -q -m ""

clean-runs:
	rm -rf checkpoints/*/
