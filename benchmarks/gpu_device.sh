#!/usr/bin/env bash
# gpu-check and the GPU benchmark on a lent GPU machine that has python3 with torch, lightning and transformers but
# not this project's other packages nor its prepared data (this workplace's device machines).  Two steps:
#
#   benchmarks/gpu_device.sh prepare   # here, in the repo root, with network: fills .gpu/ (git-ignored, ~30 MB):
#                                      # the data the checks read (bbc whole; brown and bible_en_es cut down; MiniLM's
#                                      # tokenizer, not its weights) and the missing wheels (jsonargparse ...; the
#                                      # project's transformers, tokenizers, safetensors, regex, peft)
#   benchmarks/gpu_device.sh run       # there, in the repo root, with .gpu carried: writes under $OUT
#
# `run` takes at most about 7 minutes (an estimate: not yet run on a GPU): installing the wheels, gpu-check 6 at a
# time, then the benchmark, 1 repeat, the filling batch first (a cut-short run keeps what it measured); CHECK_S and
# BENCH_S cap the two parts (defaults 150 s and 240 s).
# Back here:
#   .venv/bin/python -m benchmarks.gpu_check --readme <files>/gpu_check.json
#   .venv/bin/python -m benchmarks.gpu_bench --readme <files>/gpu.json
# write both into benchmarks/README.md.  DEEPSPEED=1 also builds DeepSpeed from its source there (about a minute
# more); without it the DeepSpeed presets are skipped.
set -u
cd "$(dirname "$0")/.."
here=$(pwd)

prepare() {
    local data=/work/main/data py=${PY:-.venv/bin/python}
    [ -d data ] && data=$(readlink -f data)
    rm -rf .gpu && mkdir -p .gpu/data/bbc .gpu/data/brown .gpu/data/bible_en_es .gpu/data/minilm .gpu/whl
    cp "$data"/bbc/* .gpu/data/bbc/  # the benchmark packs all of it (6,518 blocks of 128)
    for name in brown bible_en_es; do  # gpu-check tokenizes 64 documents (brown) or verses: a cut-down copy
        local keep=80; [ "$name" = bible_en_es ] && keep=4000
        cp "$data/$name/manifest.json" ".gpu/data/$name/"
        head -n "$keep" "$data/$name/train.jsonl" > ".gpu/data/$name/train.jsonl"
        for split in validation test; do head -n 40 "$data/$name/$split.jsonl" > ".gpu/data/$name/$split.jsonl"; done
    done
    for f in manifest.json config.json tokenizer.json tokenizer_config.json special_tokens_map.json vocab.txt; do
        cp "$data/minilm/$f" .gpu/data/minilm/
    done
    local platform="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    $py -m pip download -q --no-deps --only-binary=:all: $platform -d .gpu/whl \
        jsonargparse==4.53.0 docstring_parser==0.18.0 typeshed_client==2.15.0 \
        transformers==5.23.0 tokenizers==0.23.3 safetensors==0.8.0 regex==2026.11.19 peft==0.21.2 || return 1
    if [ "${DEEPSPEED:-0}" = 1 ]; then
        $py -m pip download -q --no-deps --only-binary=:all: $platform -d .gpu/whl hjson==3.1.0 pydantic==2.14.4 \
            pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 || return 1
        $py -m pip download -q --no-deps --no-binary=:all: -d .gpu/sdist deepspeed==0.19.8 || return 1
    fi
    du -sh .gpu
}

run() {
    local out=${OUT:-/tmp/gpu_out} site=/tmp/ptm_site
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site \
        .gpu/whl/*.whl > "$out/setup.txt" 2>&1 || { tail -5 "$out/setup.txt"; return 1; }
    if ls .gpu/sdist/deepspeed-*.tar.gz > /dev/null 2>&1; then
        DS_BUILD_OPS=0 timeout 180 python3 -m pip install -q --no-index --no-deps --no-build-isolation \
            --target $site .gpu/sdist/deepspeed-*.tar.gz >> "$out/setup.txt" 2>&1 || echo "deepspeed: not installed"
    fi
    export PYTHONPATH=$site PTM_DATA_DIR=$here/.gpu/data PTM_CACHE_DIR=/tmp/ptm_cache HF_HUB_OFFLINE=1 \
        TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
    nvidia-smi -L
    python3 -c "import torch, lightning, transformers; print('torch', torch.__version__, 'lightning', \
lightning.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
    timeout "${CHECK_S:-150}" python3 -m benchmarks.gpu_check --jobs 6 --timeout 140 --out /tmp/gpu_check \
        2>&1 | tee "$out/gpu_check.txt"
    cp /tmp/gpu_check/gpu_check.json "$out/" 2>/dev/null
    tar czf "$out/gpu_check_logs.tgz" -C /tmp/gpu_check logs 2>/dev/null
    timeout "${BENCH_S:-240}" python3 -m benchmarks --device cuda --batch_sizes 256 32 --repeats 1 \
        --work /tmp/gpu_bench --out "$out" 2>&1 | tee "$out/bench.txt"
    (cd /tmp/gpu_bench 2>/dev/null && tar czf "$out/bench_logs.tgz" ./*.log ./*.json ./*.yaml 2>/dev/null)
    ls -la "$out"
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: benchmarks/gpu_device.sh prepare|run (see the comments at its top)"; exit 2 ;;
esac
