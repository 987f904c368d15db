"""``python main.py export``: a checkpoint or run as a transformers ``save_pretrained`` directory with its model
card (``export.export_checkpoint``), and with ``--format onnx`` also the ONNX graph of the model with its head,
checked with ONNX Runtime (``inference.onnx_export.write_onnx``)."""
from __future__ import annotations

import argparse

from ptm_app.backbones.build import quiet_transformers
from ptm_app.export import check_online, export_checkpoint, push_to_hub
from ptm_app.inference.loading import load_for_inference
from ptm_app.paths import check_output_dir

DESCRIPTION = "Export a ptm_app checkpoint as a transformers save_pretrained directory (+ tokenizer, model card)."


def export_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="main.py export", description=DESCRIPTION)
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt file or a run directory (uses its last.ckpt)")
    parser.add_argument("--output_dir", required=True, help="where to write the save_pretrained directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing non-empty --output_dir (never one holding checkpoints or a run)")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="read a checkpoint you made yourself even if it holds more than plain data (runs its code)")
    parser.add_argument("--format", choices=("transformers", "onnx"), default="transformers",
                        help="onnx: also write model.onnx (the model with its head, dynamic batch and sequence axes), "
                             "checked against PyTorch with ONNX Runtime (tolerance in onnx.json)")
    parser.add_argument("--push_to_hub", metavar="REPO",
                        help="also upload the directory to the Hugging Face Hub repository REPO (online only: needs a "
                             "network, a login, and HF_HUB_OFFLINE unset)")
    args = parser.parse_args(argv)
    check_output_dir(args.output_dir, args.overwrite, (args.ckpt_path,))
    if args.push_to_hub:
        check_online(args.push_to_hub)
    also = None
    if args.format == "onnx":
        from ptm_app.inference.onnx_export import write_onnx

        loaded = load_for_inference(args.ckpt_path, args.trust_checkpoint)
        also = lambda directory: write_onnx(loaded, directory)  # noqa: E731
    with quiet_transformers():  # no "Writing model shards" bar: the command prints its one result line
        out = export_checkpoint(args.ckpt_path, args.output_dir, trust=args.trust_checkpoint, also=also)
    print(f"exported {args.ckpt_path} -> {out}" + (f" (with {out / 'model.onnx'})" if also else ""))
    if args.push_to_hub:
        push_to_hub(out, args.push_to_hub)
    return 0
