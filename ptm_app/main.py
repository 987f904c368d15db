"""Dispatch: data, export, prune, quantize, embed, generate, report, sweep (and predict given texts) are plain functions; fit, validate,
test and predict --config go to LightningCLI."""
from __future__ import annotations


USAGE = """usage: python main.py COMMAND [options]

commands:
  fit | validate | test | predict   LightningCLI runs: --config FILE.yaml [--key value ...] [--ckpt_path last|best|FILE]
  data prepare [NAME ...] [--force]  fetch, verify and convert the real datasets and models (data list: status)
  export --ckpt_path RUN_OR_CKPT --output_dir DIR [--overwrite] [--format transformers|onnx] [--push_to_hub REPO]
                                     write a transformers save_pretrained directory with the tokenizer and a
                                     model card (README.md); --push_to_hub uploads it (online only)
  embed --ckpt_path REF (--text "..." ... | --input FILE) [--pooling cls|mean|scalar_mix] [--normalize]
        [--output FILE.npy|.jsonl] [--similarity]
                                     sentence embeddings from a run, checkpoint, export or prepared model
  generate --ckpt_path REF --prompt "..." [--max_new_tokens N] [--do_sample --temperature T --top_k K --top_p P]
        [--num_beams B] [--seed S] [--chat]
                                     text from a causal LM or seq2seq run, export or prepared model (smollm2)
  predict --ckpt_path REF (--text "..." ... | --input FILE | --question "..." --context "...")
        [--output FILE.jsonl] [--too_long truncate|refuse] [--precision run|32|bf16] [--backend torch|onnxruntime]
                                     labels + probabilities, values, word tags, answer spans or generated text
                                     from a fine-tuned run or export
  serve --ckpt_path REF [--task predict|embed|generate] [--port 8000] [--workers 1] [--max_batch_size 8]
        [--batch_timeout 0.01] [--too_long truncate|refuse] [--max_request_bytes 2097152]
                                     an HTTP endpoint (LitServe): POST /predict with JSON, GET /health
  quantize --ckpt_path REF --output_dir DIR [--overwrite] [--backend torch_ao|weight_only] [--eval_source bbc]
                                     dynamic int8 of a run, export or QAT run (predict loads the directory);
                                     summary.json: size, CPU latency at batch 1 / 32, accuracy before and after
  prune --ckpt_path REF --output_dir DIR [--overwrite] [--heads 0.5 --rounds 5] [--drop_layers top:3] [--sparsity 0.5]
        [--eval_source bbc]
                                     one-shot pruning without fine-tuning (PruningModule prunes while fine-tuning);
                                     summary.json: parameters, size, sparsity, latency, accuracy before and after
  compress-report --config configs/compress/report_bbc.yaml [--key value ...]
                                     the compression table (Qiu et al. Table 3) measured from the rows' runs:
                                     parameters, size, CPU latency at batch 1 / 32, speed-up, metric % of teacher
  report RUN_DIR_OR_GLOB ... [--output results]
                                     results table (.md + .csv) from the runs' summary.json files
  sweep PLAN.yaml [--only GLOB ...] [--list]
                                     run a grid of configs (fit + test), then its results table
  knowledge-report PLAN.yaml [--collect_only] [--only ID ...]
                                     knowledge-enhanced PTMs side by side (configs/sweeps/knowledge_brown.yaml):
                                     pre-train, export, probe, fine-tune (resumable), then the generated table
  plot RUN_DIR ... [--metrics train/loss val/acc ...] [--output FILE.png]
                                     the runs' logged curves (loss, validation metrics, throughput) in one PNG
  probe --config configs/analysis/probe_minilm.yaml [--key value ...]
                                     layer-wise probes, control tasks, scalar mix and center of gravity
  contextuality --config configs/analysis/contextuality_minilm.yaml [--key value ...]
                                     self-similarity, intra-sentence similarity, explainable variance per layer
  attention --config configs/analysis/attention_minilm.yaml [--key value ...]
                                     per-head entropy, attention to [CLS]/[SEP]/punctuation, distance; heat maps
  knowledge-probe --config configs/analysis/knowledge_probe_smollm2.yaml [--key value ...]
                                     LAMA cloze queries from WordNet relations: P@1, P@10, MRR per relation
  robustness --config configs/analysis/robustness_tweets_minilm.yaml [--key value ...]
                                     a fine-tuned classifier on typo / word-dropout / synonym-perturbed test sets

'python main.py fit --help' lists every config key; see README.md for the config catalogue."""


ANALYSIS = {"plot": ("ptm_app.analysis.plot", "plot_command"),
            "probe": ("ptm_app.analysis.probing", "probe_command"),
            "contextuality": ("ptm_app.analysis.contextuality", "contextuality_command"),
            "attention": ("ptm_app.analysis.attention", "attention_command"),
            "knowledge-probe": ("ptm_app.analysis.knowledge_probe", "knowledge_probe_command"),
            "robustness": ("ptm_app.analysis.robustness", "robustness_command"),
            "compress-report": ("ptm_app.inference.compression_report", "compress_report_command")}


def main(argv: list[str]) -> int:
    from ptm_app.config_errors import guarded

    command = argv[0] if argv else "--help"
    if command in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    name_cpu_for_deepspeed()
    return guarded(_dispatch, argv)


def name_cpu_for_deepspeed() -> None:
    """On a machine without CUDA, ``DS_ACCELERATOR=cpu`` (as the DeepSpeed strategy sets it): DeepSpeed, which
    transformers and accelerate import when it is installed, otherwise prints "Setting accelerator to CPU ..." to
    the console of every command that saves or loads a model."""
    import os

    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"


def _dispatch(argv: list[str]) -> int:
    from ptm_app.config_errors import check_config_files
    from ptm_app.errors import PtmError

    command = argv[0]
    check_config_files(argv[1:])
    if command == "data":
        from ptm_app.data.prepare import data_command

        return data_command(argv[1:])
    if command == "export":
        from ptm_app.inference.export_command import export_command

        return export_command(argv[1:])
    if command == "embed":
        from ptm_app.inference.embed import embed_command

        return embed_command(argv[1:])
    if command == "generate":
        from ptm_app.inference.generate import generate_command

        return generate_command(argv[1:])
    if command == "serve":
        import importlib.util

        if importlib.util.find_spec("litserve") is None:
            raise PtmError("serve needs the serve extra: pip install -c constraints-cpu.txt -e '.[serve]'")
        from ptm_app.inference.serve import serve_command

        return serve_command(argv[1:])
    if command == "predict" and _labels_texts(argv[1:]):
        from ptm_app.inference.predict import predict_command

        return predict_command(argv[1:])
    if command == "prune":
        from ptm_app.inference.prune import prune_command

        return prune_command(argv[1:])
    if command == "quantize":
        from ptm_app.inference.quantize import quantize_command

        return quantize_command(argv[1:])
    if command == "report":
        from ptm_app.report import report_command

        return report_command(argv[1:])
    if command == "sweep":
        from ptm_app.sweep import sweep_command

        return sweep_command(argv[1:])
    if command == "knowledge-report":
        from ptm_app.knowledge_report import knowledge_report_command

        return knowledge_report_command(argv[1:])
    if command in ANALYSIS:
        import importlib

        module, function = ANALYSIS[command]
        return getattr(importlib.import_module(module), function)(argv[1:])
    from ptm_app.cli import run_lightning

    return run_lightning(argv)


def _labels_texts(argv: list[str]) -> bool:
    """``predict`` given texts (``--text`` / ``--input``): ptm_app's own command, not LightningCLI's
    ``predict --config`` (which labels the data's test split)."""
    return any(a in ("--text", "--input", "--question") or a.startswith(("--text=", "--input=", "--question="))
               for a in argv)
