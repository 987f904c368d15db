"""``main.py generate``: greedy equals transformers' generate, seeded sampling repeats, classifiers are refused."""
import pytest
import torch

from ptm_app.main import main
from tests.conftest import run_main

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "the cat sat on"


def exported(run, tmp_path):
    out = tmp_path / "export"
    assert run_main(["export", "--ckpt_path", str(run), "--output_dir", str(out)], run.parent) == 0
    return out


def test_greedy_equals_transformers_generate(clm_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["generate", "--ckpt_path", str(clm_run), "--prompt", PROMPT, "--max_new_tokens", "12"]) == 0
    streamed = capsys.readouterr().out
    out = exported(clm_run, tmp_path)
    tok, model = AutoTokenizer.from_pretrained(out), AutoModelForCausalLM.from_pretrained(out).eval()
    enc = tok(PROMPT, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=model.config.eos_token_id)
    want = tok.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert len(ids[0]) == enc["input_ids"].shape[1] + 12
    assert streamed == want + "\n"
    assert main(["generate", "--ckpt_path", str(out), "--prompt", PROMPT, "--max_new_tokens", "12"]) == 0  # export
    assert capsys.readouterr().out.splitlines()[-1] == want


def test_smollm2_chat_greedy_equals_transformers_generate(capsys):
    """A real model, so the continuation is not a tiny model's repeated newline: --chat lays out ChatML."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ptm_app.data.sources import prepared_dir

    question = "What is the capital of France?"
    assert main(["generate", "--ckpt_path", "smollm2", "--prompt", question, "--chat", "--max_new_tokens", "8"]) == 0
    streamed = capsys.readouterr().out
    where = prepared_dir("smollm2")
    tok, model = AutoTokenizer.from_pretrained(where), AutoModelForCausalLM.from_pretrained(where).eval()
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    enc = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**enc, max_new_tokens=8, do_sample=False)
    want = tok.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in want and streamed == want + "\n"


def test_beam_search_equals_transformers(clm_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from ptm_app.inference.generate import generate

    out = exported(clm_run, tmp_path)
    text = generate(str(clm_run), PROMPT, max_new_tokens=8, num_beams=3, stream=False)
    from ptm_app.inference.loading import load_for_inference

    loaded = load_for_inference(str(clm_run))
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    enc = loaded.tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**enc, max_new_tokens=8, num_beams=3, do_sample=False,
                             pad_token_id=model.config.eos_token_id)
    assert text == loaded.tokenizer.decode(ids[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def test_seeded_sampling_repeats(clm_run):
    from ptm_app.inference.generate import generate

    def sample(seed):
        return generate(str(clm_run), PROMPT, max_new_tokens=16, do_sample=True, temperature=1.5, top_k=0,
                        seed=seed, stream=False)

    first, again = sample(1), sample(1)
    assert first == again and len(first) > 0
    assert len({first, sample(2), sample(3)}) > 1  # the seed matters


def test_classifier_is_refused_in_one_line(classifier_run, capsys):
    code = main(["generate", "--ckpt_path", str(classifier_run), "--prompt", PROMPT])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "SequenceClassificationModule" in err[0] and "no language-modelling head" in err[0]


def test_sampling_knobs_need_do_sample(clm_run, capsys):
    assert main(["generate", "--ckpt_path", str(clm_run), "--prompt", PROMPT, "--temperature", "0.7"]) == 2
    assert "--do_sample" in capsys.readouterr().err


def test_encoder_decoder_directory_generates_like_transformers(clm_run, tmp_path, capsys):
    """A T5 save_pretrained directory (random weights: a varied continuation): its model class is read from the config
    and the encoder gets ``prompt [EOS]``, the layout of our T5/BART pre-training."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, T5Config

    tok = AutoTokenizer.from_pretrained(exported(clm_run, tmp_path))
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    config = T5Config(vocab_size=len(tok), d_model=32, d_ff=64, d_kv=16, num_layers=2, num_heads=2,
                      decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=eos,
                      architectures=["T5ForConditionalGeneration"])
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    where = tmp_path / "t5"
    model.save_pretrained(where)
    tok.save_pretrained(where)
    capsys.readouterr()
    assert main(["generate", "--ckpt_path", str(where), "--prompt", PROMPT, "--max_new_tokens", "10",
                 "--num_beams", "2"]) == 0
    printed = capsys.readouterr().out
    ids = torch.tensor([tok(PROMPT, add_special_tokens=False)["input_ids"] + [eos]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, num_beams=2,
                             do_sample=False)
    want = tok.decode(out[0], skip_special_tokens=True)
    assert len(set(out[0].tolist())) > 2 and printed == want + "\n"


def test_chat_without_a_chat_template_is_refused(clm_run, capsys):
    assert main(["generate", "--ckpt_path", str(clm_run), "--prompt", PROMPT, "--chat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no chat template" in err[0], err


@pytest.mark.parametrize("case", ["empty", "blank", "beyond", "prompt_alone"])
def test_an_empty_prompt_or_one_beyond_the_positions_is_one_line(clm_run, capsys, case):
    """TINY_GPT2 has 64 positions: the prompt's n tokens + 64 - n new ones fit, one more does not (an IndexError
    traceback before), nor does a prompt of 64 tokens or more; an empty prompt is refused too."""
    from ptm_app.inference.loading import load_for_inference

    n = len(load_for_inference(str(clm_run)).tokenizer(PROMPT)["input_ids"])
    long_prompt = " ".join([PROMPT] * 20)
    prompt, new, expected = {
        "empty": ("", 4, "the prompt is empty"), "blank": ("  ", 4, "the prompt is empty"),
        "beyond": (PROMPT, 65 - n, f"needs 65 positions, over the model's limit of 64; lower max_new_tokens to {64 - n}"),
        "prompt_alone": (long_prompt, 1, "leaves no room for new tokens in the model's limit of 64 positions")}[case]
    assert main(["generate", "--ckpt_path", str(clm_run), "--prompt", prompt, "--max_new_tokens", str(new)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    if case == "beyond":  # the largest that fits runs
        assert main(["generate", "--ckpt_path", str(clm_run), "--prompt", PROMPT, "--max_new_tokens", str(64 - n)]) == 0
