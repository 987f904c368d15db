"""``python main.py export``: a checkpoint or run as a transformers ``save_pretrained`` directory with its model
card (``inference.export.export_checkpoint``), and with ``--format onnx`` also the ONNX graph of the model with its head,
checked with ONNX Runtime (``inference.onnx_export.write_onnx``)."""
from __future__ import annotations

from typing import Literal, Optional

from ptm_app.backbones.build import quiet_transformers
from ptm_app.inference.export import check_online, export_checkpoint
from ptm_app.inference.export import push_to_hub as upload_to_hub  # the parameter is named push_to_hub
from ptm_app.inference.loading import load_for_inference
from ptm_app.paths import check_output_dir



def export_command(ckpt_path: str, output_dir: str, overwrite: bool = False, trust_checkpoint: bool = False,
                   format: Literal["transformers", "onnx"] = "transformers", push_to_hub: Optional[str] = None) -> int:
    """Export a ptm_app checkpoint as a transformers save_pretrained directory (+ tokenizer, model card).

    Args:
        ckpt_path: a .ckpt file or a run directory (uses its last.ckpt).
        output_dir: where to write the save_pretrained directory.
        overwrite: replace an existing non-empty --output_dir (never one holding checkpoints or a run).
        trust_checkpoint: read a checkpoint you made yourself even if it holds more than plain data (runs its code).
        format: onnx: also write model.onnx (the model with its head, dynamic batch and sequence axes), checked
            against PyTorch with ONNX Runtime (tolerance in onnx.json).
        push_to_hub: also upload the directory to this Hugging Face Hub repository (online only: needs a network, a
            login, and HF_HUB_OFFLINE unset).
    """
    check_output_dir(output_dir, overwrite, (ckpt_path,))
    if push_to_hub:
        check_online(push_to_hub)
    also = None
    if format == "onnx":
        from ptm_app.inference.onnx_export import write_onnx

        loaded = load_for_inference(ckpt_path, trust_checkpoint)
        also = lambda directory: write_onnx(loaded, directory)  # noqa: E731
    with quiet_transformers():  # no "Writing model shards" bar: the command prints its one result line
        out = export_checkpoint(ckpt_path, output_dir, trust=trust_checkpoint, also=also)
    print(f"exported {ckpt_path} -> {out}" + (f" (with {out / 'model.onnx'})" if also else ""))
    if push_to_hub:
        upload_to_hub(out, push_to_hub)
    return 0
