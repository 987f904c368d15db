"""The commands use a run's own layouts: a GenerationModule's prompt layout (decoder and encoder–decoder) gives
the module's own generations; a frozen-features run embeds with its trained scalar mix."""
import numpy as np
import pytest
import torch

from ptm_app.adaptation.generation import GenerationModule
from ptm_app.data.sources import prepared_dir
from ptm_app.inference.embed import embed_texts
from ptm_app.inference.generate import decoding_settings, generate_ids, prompt_inputs
from ptm_app.inference.loading import LoadedModel
from tests.conftest import TINY_BERT, TINY_GPT2

pytestmark = pytest.mark.usefixtures("one_thread")

TINY_BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
             "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
             "max_position_embeddings": 64}
SOURCES = ["the cat sat on the mat", "markets rose as shares fell"]


def minilm_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepared_dir("minilm"))


@pytest.mark.parametrize("config", [{**TINY_GPT2, "bos_token_id": 101}, TINY_BART], ids=["decoder", "encoder_decoder"])
def test_generation_module_prompt_layout_gives_its_own_generations(config):
    tok = minilm_tokenizer()
    torch.manual_seed(0)
    module = GenerationModule(backbone_config={**config, "vocab_size": len(tok), "pad_token_id": 0,
                                               "eos_token_id": 102, "decoder_start_token_id": 101},
                              max_new_tokens=6).build().eval()
    module.tokenizer = tok
    loaded = LoadedModel("tiny", module.backbone, tok, module.model_class, module)
    settings = decoding_settings(loaded, 6, False, None, None, None, 1)
    for source in SOURCES:
        example = {"source_ids": tok(source, add_special_tokens=False)["input_ids"], "target_ids": [], "target": "",
                   "key": 0}
        theirs = module.generate(module.make_collator(tok)([example]))[0]  # the module's validation generation
        ids = generate_ids(loaded, prompt_inputs(loaded, source), settings)
        assert tok.decode(ids[0], skip_special_tokens=True).strip() == theirs and theirs


def test_frozen_features_run_embeds_with_its_trained_scalar_mix():
    from ptm_app.adaptation.features import FeatureExtractionModule
    from ptm_app.adaptation.policies import FrozenFeatures

    tok = minilm_tokenizer()
    torch.manual_seed(0)
    module = FeatureExtractionModule(backbone_config={**TINY_BERT, "vocab_size": len(tok)}, labels=["a", "b"],
                                     representation="scalar_mix", do_layer_norm=True).build().eval()
    with torch.no_grad():
        module.mix.weights.copy_(torch.tensor([2.0, -1.0, 0.5]))  # as if trained: far from uniform
        module.mix.gamma.fill_(1.7)
    module.tokenizer = tok
    loaded = LoadedModel("features", module.backbone, tok, module.model_class, module)
    got = embed_texts(loaded, SOURCES)  # default pooling for a run with a trained mix: scalar_mix
    batch = tok(SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        features = module.policy(FrozenFeatures)  # the run's own pooled features (mean over real tokens)
        want = features.pooled(features.token_features(module, dict(batch)), dict(batch)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    top = embed_texts(loaded, SOURCES, pooling="mean")
    assert np.abs(top - want).max() > 1e-2  # the mix is not just the top layer


def test_features_run_and_its_export_embed_and_predict_alike(features_run, tmp_path, capsys):
    import json

    from ptm_app.inference.loading import load_for_inference
    from ptm_app.inference.predict import predict_rows
    from ptm_app.main import main
    from tests.conftest import run_main

    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(features_run), "--output_dir", str(out)], features_run.parent) == 0
    assert (out / "module_config.json").is_file()  # the mix and the task head live outside the backbone
    run, export = load_for_inference(str(features_run)), load_for_inference(str(out))
    assert type(export.module).__name__ == "FeatureExtractionModule"
    weights = run.module.mix.layer_weights()
    assert float(weights.max() - weights.min()) > 1e-4  # the mix trained away from uniform
    np.testing.assert_allclose(embed_texts(export, SOURCES), embed_texts(run, SOURCES), atol=1e-5)
    mine = predict_rows(export, SOURCES)
    theirs = predict_rows(run, SOURCES)
    assert [r["label"] for r in mine] == [r["label"] for r in theirs]
    for a, b in zip(mine, theirs):
        assert a["probs"] == pytest.approx(b["probs"], abs=2e-6)
    capsys.readouterr()
    assert main(["embed", "--ckpt_path", str(out), "--text", SOURCES[0]]) == 0  # default pooling: the trained mix
    row = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(row["embedding"], embed_texts(run, SOURCES[:1], pooling="scalar_mix")[0], atol=1e-5)


def test_multiple_choice_model_embeds_with_its_encoder():
    import transformers

    tok = minilm_tokenizer()
    torch.manual_seed(0)
    config = transformers.BertConfig(**{k: v for k, v in TINY_BERT.items() if k != "model_type"}, vocab_size=len(tok))
    model = transformers.AutoModelForMultipleChoice.from_config(config).eval()
    got = embed_texts(LoadedModel("choice", model, tok, "multiple_choice"), ["x", *SOURCES])  # 3 rows, padded
    with torch.no_grad():
        want = model.bert(**tok([SOURCES[1]], return_tensors="pt")).last_hidden_state[0].mean(0)
    np.testing.assert_allclose(got[2], want.numpy(), atol=1e-5)
