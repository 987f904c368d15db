# ptm_app: `make demo` runs the main job, `make test` the test suite; both set everything up first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := constraints-cpu.txt
STAMP := $(VENV)/.installed
export TOKENIZERS_PARALLELISM := false
export HF_HUB_OFFLINE := 1
# DeepSpeed JIT-builds its CPU comm op on first use (~60 s): setup builds it, kept with the venv's torch
export TORCH_EXTENSIONS_DIR := $(CURDIR)/$(VENV)/torch_extensions

.PHONY: setup data demo test test-durations test-slow test-all results analysis compress knowledge taxonomy taxonomy-quick optimisers benchmarks multimodal multilingual translation bench gpu-check clean-runs

$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip -c $(CONSTRAINTS)
	$(PIP) install -q -c $(CONSTRAINTS) torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -c $(CONSTRAINTS) -e ".[dev,deepspeed,onnx,serve,data,hub]"
	$(PIP) install -q -c $(CONSTRAINTS) --no-deps litdata==0.2.76
	DS_ACCELERATOR=cpu $(PY) -c "from deepspeed.accelerator import get_accelerator as a; \
	  a().create_op_builder('ShareMemCommBuilder').load()" > $(VENV)/deepspeed_ops.log 2>&1 \
	  || { tail -20 $(VENV)/deepspeed_ops.log; exit 1; }
	touch $(STAMP)

setup: $(STAMP)

data: setup
	$(PY) main.py data prepare

# The main job: MLM continued pre-training of MiniLM on BBC articles, export, fine-tuning on BBC
# topics from that checkpoint, then the test metrics of the best checkpoint.  It prepares only the two sources it
# reads (make data prepares all of them).  Precision and accelerator: auto (training/precision.py).
DEMO_DATA := bbc minilm
demo: setup
	$(PY) main.py data prepare $(DEMO_DATA)
	$(PY) main.py fit --config configs/demo/minilm_mlm_bbc.yaml
	$(PY) main.py export --ckpt_path checkpoints/demo_mlm --output_dir checkpoints/demo_mlm/export --overwrite
	$(PY) main.py fit --config configs/demo/demo_mlm_full_bbc.yaml
	$(PY) main.py test --config configs/demo/demo_mlm_full_bbc.yaml --ckpt_path best

# Two pytest workers (pytest-xdist), one test file each at a time, one thread each: 12-18 minutes on 2 cores (README, Tests)
TEST_WORKERS ?= 2
# Files are handed out longest first (tests/file_seconds.json, rewritten by make test-durations), not by test count
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: data
	$(PYTEST)

# The adaptation results table (docs/results/adaptation.md): every style x task cell of the plan, fit + test, then the table.
# 3 seeds per cell.  Resumable: cells with test metrics (or a current ledger entry) are skipped.  About 2-3 hours per seed
# on 2 CPU cores.
results: data
	$(PY) main.py sweep configs/sweeps/adapt_minilm.yaml --readme docs/results/adaptation.md --ledger docs/results/ledger/adapt_minilm

# The tables and figures of docs/analyse.md: every configs/analysis recipe as shipped, into
# checkpoints/<recipe>/, each writing its tables between its markers there and its picture to docs/figures/.
# The robustness recipe evaluates the tweet and BBC classifiers, and the probe of ptm_app's own recipe the small BERT run, each made
# first when it is not there.  Slow (about two hours on 2 CPU cores); not part of `make test`.
analysis: data
	$(PY) main.py probe --config configs/analysis/minilm_probe_linear_mix.yaml --readme docs/analyse.md
	$(PY) main.py probe --config configs/analysis/minilm_smollm2_probe_mlp_brown_pos.yaml --readme docs/analyse.md
	$(PY) main.py contextuality --config configs/analysis/minilm_contextuality_brown.yaml --readme docs/analyse.md
	$(PY) main.py attention --config configs/analysis/minilm_attention_brown.yaml --readme docs/analyse.md
	$(PY) main.py knowledge-probe --config configs/analysis/smollm2_lama_wordnet.yaml --readme docs/analyse.md
	test -f checkpoints/minilm_full_tweets/checkpoints/last.ckpt || $(PY) main.py fit --config configs/adapt/minilm_full_tweets.yaml
	test -f checkpoints/minilm_lora_tweets/checkpoints/last.ckpt || $(PY) main.py fit --config configs/adapt/minilm_lora_tweets.yaml
	$(PY) main.py robustness --config configs/analysis/minilm_robustness_tweets.yaml --readme docs/analyse.md
	test -f checkpoints/minilm_freelb_tweets/checkpoints/last.ckpt || $(PY) main.py fit --config configs/adapt/minilm_freelb_tweets.yaml
	$(PY) main.py attack --config configs/analysis/minilm_attack_tweets.yaml --readme docs/results/robustness.md
	test -f checkpoints/minilm_full_bbc/checkpoints/last.ckpt || $(PY) main.py fit --config configs/adapt/minilm_full_bbc.yaml
	test -f checkpoints/minilm_lora_bbc/checkpoints/last.ckpt || $(PY) main.py fit --config configs/adapt/minilm_lora_bbc.yaml
	$(PY) main.py robustness --config configs/analysis/minilm_robustness_bbc.yaml --readme docs/analyse.md
	$(PY) main.py attack --config configs/analysis/minilm_attack_bbc.yaml --readme docs/results/robustness.md
	test -f checkpoints/bert_mlm_bbc/checkpoints/last.ckpt || $(PY) main.py fit --config configs/pretrain/bert_mlm_bbc.yaml
	$(PY) main.py probe --config configs/analysis/bert_probe_linear_mix.yaml --readme docs/analyse.md

# The compression tables (docs/results/compression.md, issue 14): every configs/compress recipe for the BBC and the tweets teachers
# (each report config names the command of each row; --make_missing true runs the ones not yet made, in order),
# then the tables, latencies measured in one process.  Hours on 2 CPU cores; not part of `make test`.
compress: data
	$(PY) main.py compress-report --config configs/compress/minilm_report_bbc.yaml --make_missing true --readme docs/results/compression.md
	$(PY) main.py compress-report --config configs/compress/minilm_report_tweets.yaml --make_missing true --readme docs/results/compression.md

# The knowledge table (docs/results/knowledge.md): five pre-trainings of the same small BERT on Brown
# (MLM, ERNIE, SenseBERT, LIBERT, KEPLER) at equal steps, each exported, probed and fine-tuned on three tasks, and
# MiniLM with and without K-Adapter; resumable (finished runs are skipped).  Many hours on 2 CPU cores (KEPLER's
# link prediction embeds every WordNet synset); not part of `make test`.  Writes checkpoints/knowledge_brown/.
knowledge: data
	$(PY) main.py knowledge-report configs/sweeps/knowledge_brown.yaml --readme docs/results/knowledge.md --ledger docs/results/ledger/knowledge_brown

# The objective taxonomy (docs/taxonomy.md, docs/results/taxonomy.md): 14 objectives and the no-pre-training floor at
# two equal training-FLOPs budgets, 3 pre-training x 3 fine-tuning seeds, five tasks and a frozen POS probe.
# Estimated (not measured) at 5 to 7 hours on 2 quiet CPU cores; resumable cell by cell.  Not part of `make test`.
# taxonomy-quick: the same machinery on tiny models on Brown (not timed; its numbers check the machinery only).
taxonomy: data
	$(PY) main.py taxonomy-report configs/sweeps/taxonomy.yaml --readme docs/results/taxonomy.md --ledger docs/results/ledger/taxonomy

# The real benchmarks (docs/results/benchmarks.md): WNUT-16, OpenMoji, SQuAD v1.1 and its derived unanswerable set,
# full fine-tuning and LoRA, 3 seeds each; the SQuAD cells take hours each on 2 CPU cores.  Not part of `make test`.
benchmarks: data
	$(PY) main.py sweep configs/sweeps/benchmarks_minilm.yaml --readme docs/results/benchmarks.md --ledger docs/results/ledger/benchmarks_minilm

# AdamW against LAMB at 8x the batch, the same tokens, 3 seeds each, paired (docs/results/optimisers.md); minutes
# on 2 CPU cores.  Not part of `make test`.
optimisers: data
	$(PY) main.py sweep configs/sweeps/optim_lamb_brown.yaml --readme docs/results/optimisers.md --ledger docs/results/ledger/optim_lamb_brown

taxonomy-quick: data
	$(PY) main.py taxonomy-report configs/sweeps/taxonomy_quick.yaml

# The multimodal table (docs/results/multimodal.md): four CLIP-style runs on the emoji pictures (two seeds on every
# style, one on Noto, one on EmojiOne), each evaluated beside its random init; about 8 min a run on 2 CPU cores.
multimodal: data
	$(PY) main.py multimodal configs/sweeps/multimodal_emoji.yaml --readme docs/results/multimodal.md --figure docs/figures/multimodal_emoji.png

# The cross-lingual table (docs/results/multilingual.md, issue 29): four small encoders at equal steps (multilingual
# BERT MLM, English-only BERT MLM, XLM MLM, XLM MLM+TLM; one shared Unigram vocabulary from the first run), then
# `crosslingual` with MiniLM as the reference.  About an hour on 2 busy CPU cores; not part of `make test`.
# fp32 (32-true) on every machine: the committed cross-lingual table was measured in fp32
XL_SMALL := --trainer.max_steps 150 --trainer.val_check_interval 150 --trainer.limit_val_batches 3 --checkpoint_every 150 \
	--trainer.precision 32-true --data.init_args.max_length 64 --data.init_args.batch_size 16
XL_BERT := '{"model_type":"bert","hidden_size":128,"num_hidden_layers":2,"num_attention_heads":2,"intermediate_size":256,"max_position_embeddings":128}'
XL_XLM := '{"model_type":"xlm","emb_dim":128,"n_layers":2,"n_heads":2,"max_position_embeddings":128}'
XL_TOK := '{"pretrained":"checkpoints/xl_mm_mlm/tokenizer","train":null}'
multilingual: data
	$(PY) main.py fit --config configs/pretrain/mbert_mlm_quran_bible.yaml $(XL_SMALL) --model.init_args.backbone_config $(XL_BERT) --run_name xl_mm_mlm
	$(PY) main.py fit --config configs/pretrain/mbert_mlm_quran_bible.yaml $(XL_SMALL) --model.init_args.backbone_config $(XL_BERT) --data.init_args.languages '[en]' --data.init_args.tokenizer $(XL_TOK) --run_name xl_en_mlm
	$(PY) main.py fit --config configs/pretrain/xlm_clm_mlm_tlm_quran_bible.yaml $(XL_SMALL) --model.init_args.backbone_config $(XL_XLM) --model.init_args.objectives '[mlm]' --data.init_args.tokenizer $(XL_TOK) --run_name xl_xlm_mlm
	$(PY) main.py fit --config configs/pretrain/xlm_clm_mlm_tlm_quran_bible.yaml $(XL_SMALL) --model.init_args.backbone_config $(XL_XLM) --model.init_args.objectives '[mlm, tlm]' --data.init_args.tokenizer $(XL_TOK) --run_name xl_xlm_mlm_tlm
	$(PY) main.py crosslingual --encoder 'English MLM=checkpoints/xl_en_mlm' --encoder 'multilingual MLM=checkpoints/xl_mm_mlm' --encoder 'XLM MLM=checkpoints/xl_xlm_mlm' \
		--encoder 'XLM MLM+TLM=checkpoints/xl_xlm_mlm_tlm' --encoder 'MiniLM=minilm' --seeds '[0, 1, 2]' --limit 200 --limit_train 500 \
		--readme docs/results/multilingual.md

# The translation table (docs/results/translation.md): mBART pre-training on both Bible sides, export, then en->es
# fine-tuning from it and from random init, 2 seeds each, predicted on the held-out books and scored by sacreBLEU
# (about 1.5 hours on 2 busy CPU cores).  Writes checkpoints/translation_bible*/.  Not part of `make test`.
translation: data
	$(PY) main.py translation-report configs/sweeps/translation_bible.yaml --readme docs/results/translation.md --ledger docs/results/ledger/translation_bible

# Side by side against the transformers Trainer and a bare PyTorch loop: MLM pre-training, fine-tuning and resume
# cost, in subprocesses, alternating, 3 repeats (about 17 minutes on 2 cores; run it on a quiet machine).
# Writes benchmarks/results.{md,json} and the table in benchmarks/README.md.  Not part of `make test`.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[bench,onnx,hub]"
	touch $(BENCH_STAMP)

bench: data $(BENCH_STAMP)
	$(PY) -m benchmarks
	$(PY) -m benchmarks --only inference

# On a machine with a CUDA GPU (and a CUDA build of torch): every pre-training recipe, strategy preset at one device,
# memory overlay and export -> fine-tune -> predict, 3 steps each with accelerator gpu, precision auto; one line each.
gpu-check: data
	$(PY) -m benchmarks.gpu_check

# The default suite with every test's time, then tests/file_seconds.json (the order make test hands files out in)
test-durations: data
	$(PYTEST) --durations=0 > checkpoints/test_durations.log 2>&1 || (tail -40 checkpoints/test_durations.log; exit 1)
	$(PY) -m tests.file_seconds checkpoints/test_durations.log

test-slow: data
	$(PYTEST) -m slow

test-all: data
	$(PYTEST) -m ""

clean-runs:
	rm -rf checkpoints/*/
