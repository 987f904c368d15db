"""Text generation from a trained LM: ``python main.py generate --ckpt_path REF --prompt "..."``.

Decoding is transformers' ``generate``: greedy by default, beam search with ``--num_beams``, or sampling with
``--do_sample`` (temperature, top-k: Fan et al. 2018; nucleus top-p: Holtzman et al. 2020), seeded by ``--seed``.
Greedy and sampled text streams to the terminal as it is produced (transformers' ``TextStreamer``).

The prompt is laid out as the model was trained:
- a causal LM (our GPT recipe runs, ``smollm2``): the tokenizer's own encoding of the prompt; ``--chat`` wraps it
  in the tokenizer's chat template (SmolLM2's ChatML) with the assistant turn opened;
- an encoder–decoder (T5 / BART recipe runs): ``prompt [EOS]`` into the encoder, the layout of their
  pre-training (``objectives.seq2seq``), the decoder started from ``decoder_start_token_id``;
- a ``GenerationModule`` run: its own collator's source layout (``[BOS] source prompt`` for a decoder,
  ``source [EOS]`` / ``[CLS] source [SEP]`` for encoder–decoders), so ``--prompt`` is the source text.
"""
from __future__ import annotations

from typing import Optional

import torch

from ptm_app.backbones.build import max_positions
from ptm_app.backbones.delta import transformers_model
from ptm_app.errors import PtmError
from ptm_app.inference.loading import LoadedModel, load_for_inference

GENERATING_MODEL_CLASSES = ("causal_lm", "seq2seq_lm")


def check_generator(loaded: LoadedModel) -> None:
    """Refuse, in one line, a model without a language-modelling head (a classifier, an encoder ...)."""
    if loaded.model_class not in GENERATING_MODEL_CLASSES or not hasattr(loaded.model, "generate"):
        raise PtmError(f"{loaded.ref} is a {loaded.kind} (model class {loaded.model_class}): it has no "
                       f"language-modelling head to generate text with; use a causal LM or seq2seq run (or embed / predict "
                       f"for this one)")


def prompt_inputs(loaded: LoadedModel, prompt: str, chat: bool = False) -> dict:
    """``input_ids`` and ``attention_mask`` [1, T] for the prompt, laid out as the model was trained; an empty
    prompt is one line."""
    if not prompt.strip():
        raise PtmError("the prompt is empty; give some text to continue")
    tok = loaded.tokenizer
    if chat:
        if not getattr(tok, "chat_template", None):
            raise PtmError(f"{loaded.ref}'s tokenizer has no chat template; drop --chat")
        prompt = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    module = loaded.module
    if module is not None and hasattr(module, "architecture") and not chat:  # a GenerationModule run
        source = tok(prompt, add_special_tokens=False)["input_ids"]
        batch = module.make_collator(tok)([{"source_ids": source, "target_ids": [], "target": "", "key": 0}])
        if module.architecture == "decoder":
            return {"input_ids": batch["prompt_input_ids"], "attention_mask": batch["prompt_attention_mask"]}
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if loaded.model_class == "seq2seq_lm":
        ids = tok(prompt, add_special_tokens=False)["input_ids"] + [special_ids(loaded)["eos_token_id"]]
        ids = torch.tensor([ids])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    enc = tok(prompt, add_special_tokens=not chat, return_tensors="pt")  # the template already holds them
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def check_positions(loaded: LoadedModel, inputs: dict, max_new_tokens: int) -> None:
    """Refuse, in one line naming the limit, a prompt and ``max_new_tokens`` that the model's position embeddings
    cannot hold (a decoder: prompt + new tokens + a soft prompt's virtual tokens; an encoder–decoder: the prompt in
    the encoder, the start token + new tokens in the decoder).  Models without a position limit (T5) pass."""
    model = transformers_model(loaded.model)
    limit = max_positions(model)
    prompt = int(inputs["input_ids"].shape[1])
    if prompt == 0:
        raise PtmError("the prompt holds no tokens; give some text to continue")
    if limit is None:
        return
    virtual = loaded.module.virtual_positions() if hasattr(loaded.module, "virtual_positions") else 0
    if loaded.model_class == "seq2seq_lm":
        if prompt > limit:
            raise PtmError(f"the prompt is {prompt} tokens, over the model's limit of {limit} positions; shorten it")
        if max_new_tokens + 1 > limit:
            raise PtmError(f"max_new_tokens={max_new_tokens} is over the model's limit of {limit} positions "
                           f"(with the decoder's start token); use at most {limit - 1}")
        return
    used = prompt + virtual
    what = f"the prompt ({prompt} tokens" + (f" + {virtual} virtual tokens" if virtual else "") + ")"
    if used >= limit:
        raise PtmError(f"{what} leaves no room for new tokens in the model's limit of {limit} positions; "
                       f"shorten it")
    if used + max_new_tokens > limit:
        raise PtmError(f"{what} plus max_new_tokens={max_new_tokens} needs {used + max_new_tokens} positions, over "
                       f"the model's limit of {limit}; lower max_new_tokens to {limit - used} or shorten the prompt")


def special_ids(loaded: LoadedModel) -> dict:
    """pad, EOS and decoder-start ids: a GenerationModule's own, else the generation config's, the model
    config's and the tokenizer's, in that order."""
    module = loaded.module
    if module is not None and hasattr(module, "token_ids"):
        return module.token_ids()
    model, tok = transformers_model(loaded.model), loaded.tokenizer
    sources = (getattr(model, "generation_config", None), model.config)

    def pick(name: str, fallback):
        for source in sources:
            value = getattr(source, name, None)
            if value is not None:
                return value
        return fallback

    eos = pick("eos_token_id", tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id)
    first_eos = eos[0] if isinstance(eos, list) else eos
    if first_eos is None:
        raise PtmError(f"{loaded.ref} defines no end-of-sequence token (model config or tokenizer); "
                       f"it cannot end a generation")
    return {"pad_token_id": pick("pad_token_id", tok.pad_token_id if tok.pad_token_id is not None else first_eos),
            "eos_token_id": first_eos if loaded.model_class == "seq2seq_lm" else eos,
            "decoder_start_token_id": pick("decoder_start_token_id", pick("bos_token_id", None))}


def decoding_settings(loaded: LoadedModel, max_new_tokens: int, do_sample: bool, temperature: Optional[float],
                      top_k: Optional[int], top_p: Optional[float], num_beams: int) -> dict:
    """``generate`` keyword arguments; sampling knobs without ``do_sample`` are refused rather than ignored."""
    if max_new_tokens < 1 or num_beams < 1:
        raise PtmError("--max_new_tokens and --num_beams must be at least 1")
    knobs = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    given = [name for name, value in knobs.items() if value is not None]
    if given and not do_sample:
        raise PtmError(f"--{' --'.join(given)} only apply to sampling; add --do_sample (or drop them for greedy)")
    if temperature is not None and temperature <= 0:
        raise PtmError("--temperature must be above 0 (use greedy decoding, without --do_sample, for the argmax)")
    if top_p is not None and not 0 < top_p <= 1:
        raise PtmError("--top_p must be in (0, 1]")
    if top_k is not None and top_k < 0:
        raise PtmError("--top_k must be 0 (off) or more")
    ids = special_ids(loaded)
    settings = {"max_new_tokens": max_new_tokens, "num_beams": num_beams, "do_sample": do_sample,
                "pad_token_id": ids["pad_token_id"], "eos_token_id": ids["eos_token_id"]}
    if do_sample:  # transformers' defaults (1.0, 50, 1.0) unless given
        settings.update(temperature=1.0 if temperature is None else temperature,
                        top_k=50 if top_k is None else top_k, top_p=1.0 if top_p is None else top_p)
    if loaded.model_class == "seq2seq_lm" and ids["decoder_start_token_id"] is not None:
        settings["decoder_start_token_id"] = ids["decoder_start_token_id"]
    delta = getattr(loaded.module, "delta", None)
    if delta is not None and delta.method == "pals":  # causal PALs keep no KV cache (adaptation.generation)
        settings["use_cache"] = False
    return settings


@torch.no_grad()
def generate_ids(loaded: LoadedModel, inputs: dict, settings: dict, seed: Optional[int] = None,
                 streamer=None) -> torch.Tensor:
    """The new token ids [1, N] (without the prompt)."""
    if seed is not None:
        from transformers import set_seed

        set_seed(seed)
    out = loaded.model.generate(**inputs, **settings, streamer=streamer)
    return out if loaded.model_class == "seq2seq_lm" else out[:, inputs["input_ids"].shape[1]:]


def generate(ckpt_path: str, prompt: str, max_new_tokens: int = 64, do_sample: bool = False,
             temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
             num_beams: int = 1, seed: Optional[int] = None, chat: bool = False, stream: bool = True,
             trust_checkpoint: bool = False) -> str:
    """Text from a causal LM or seq2seq run, export or prepared model (smollm2).

    Continues ``prompt`` (or answers it, with ``chat``) and prints the text (streamed for greedy and sampling).

    Args:
        ckpt_path: a causal LM or seq2seq run directory, .ckpt, export directory or prepared model (smollm2).
        prompt: the text to continue (a GenerationModule run: its source text).
        max_new_tokens: tokens to generate at most.
        do_sample: sample instead of greedy / beam decoding.
        temperature: sampling temperature (default 1.0; needs --do_sample).
        top_k: sample among the k likeliest tokens (default 50; 0 = off; needs --do_sample).
        top_p: nucleus sampling mass (default 1.0 = off; needs --do_sample).
        num_beams: beam search width (1 = greedy / sampling).
        seed: seed for sampling (the same seed gives the same text).
        chat: apply the tokenizer's chat template (e.g. smollm2).
        stream: print the text as it is produced (false: print nothing, return it).
        trust_checkpoint: read a checkpoint you made yourself even if it holds more than plain data (runs its code).
    """
    loaded = load_for_inference(ckpt_path, trust_checkpoint)
    check_generator(loaded)
    settings = decoding_settings(loaded, max_new_tokens, do_sample, temperature, top_k, top_p, num_beams)
    inputs = prompt_inputs(loaded, prompt, chat)
    check_positions(loaded, inputs, max_new_tokens)
    streamer = None
    if stream and num_beams == 1:
        from transformers import TextStreamer

        streamer = TextStreamer(loaded.tokenizer, skip_prompt=True, skip_special_tokens=True)
    text = loaded.tokenizer.decode(generate_ids(loaded, inputs, settings, seed, streamer)[0], skip_special_tokens=True)
    if streamer is None and stream:
        print(text)
    return text
