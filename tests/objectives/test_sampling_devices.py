"""Every sampled corruption draws from a generator on the device of the tensor it samples (issue 24), seeded from
the run seed and the batch keys.

A CPU-only build cannot make a CUDA generator, and meta tensors take a CPU generator without complaint, so the
checks are made here by recording: ``torch.Generator`` is replaced by a factory that notes the device each
generator was asked for, and torch's samplers (multinomial, bernoulli, randperm, rand, randint, randn) check that
device against the device of the tensor they sample.  Each objective's training step runs under that audit (its
collator, on the CPU, outside it), and ELECTRA's once more with G's logits reporting an accelerator device, as
in a GPU run: a generator made on the CPU (the crash ``Expected a 'cuda' device type for generator but found
'cpu'``) fails there.  A static check complements it: model-side code names the device of every generator."""
import ast
import warnings
from pathlib import Path

import pytest
import torch

from ptm_app.data.collators import CLMCollator, MLMCollator, TLMCollator
from ptm_app.data.parallel import tlm_example
from tests.conftest import TINY_BERT, TINY_GPT2

ROOT = Path(__file__).resolve().parents[2]
SAMPLERS = ("multinomial", "bernoulli", "randperm", "rand", "randint", "randn")
REAL_GENERATOR = torch.Generator
SPECIAL = (0, 1, 2, 3, 4)
V = 60


class Elsewhere(torch.Tensor):
    """A CPU tensor that reports an accelerator device, as a model's outputs do in a GPU run."""

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0)


class SamplingAudit:
    """Records the device each generator was made for and, at every sampler call with a generator, the device of
    the tensor it samples (the input of multinomial / bernoulli, the ``device=`` of the others)."""

    def __init__(self):
        self.requested: dict[int, torch.device | None] = {}
        self.calls: list[tuple[str, object, torch.device]] = []

    def generator(self, device=None):
        gen = REAL_GENERATOR()  # this build has no other; the requested device is what is checked
        self.requested[id(gen)] = torch.device(device) if device is not None else None
        return gen

    def sampler(self, name: str, real):
        def sample(*args, generator=None, **kwargs):
            if generator is not None:
                if name in ("multinomial", "bernoulli"):
                    sampled = args[0].device
                else:
                    sampled = torch.device(kwargs.get("device") or "cpu")
                made_for = self.requested.get(id(generator), generator.device)
                self.calls.append((name, made_for, sampled))
                args = tuple(a.as_subclass(torch.Tensor) if isinstance(a, Elsewhere) else a for a in args)
            return real(*args, generator=generator, **kwargs)
        return sample

    def install(self, monkeypatch) -> "SamplingAudit":
        monkeypatch.setattr(torch, "Generator", self.generator)
        for name in SAMPLERS:
            monkeypatch.setattr(torch, name, self.sampler(name, getattr(torch, name)))
        return self

    def mismatches(self) -> list:
        """Draws whose generator was not made, naming it, for the device of the tensor they sample."""
        return [call for call in self.calls if call[1] != call[2]]


def examples(n=4, length=14, seed=0):
    gen = REAL_GENERATOR().manual_seed(seed)
    return [{"input_ids": torch.cat([torch.tensor([2]), torch.randint(5, V, (length,), generator=gen),
                                     torch.tensor([3])]), "key": (0, i)} for i in range(n)]


def mlm_collator(**kw) -> MLMCollator:
    return MLMCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=V, seed=1,
                       mlm_probability=0.3, **kw)


TINY_ELECTRA = {"model_type": "electra", "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64, "vocab_size": V}
TINY_BART = {"model_type": "bart", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
             "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
             "max_position_embeddings": 64, "vocab_size": V, "pad_token_id": 0, "eos_token_id": 3,
             "bos_token_id": 2, "decoder_start_token_id": 2}
TINY_T5 = {"model_type": "t5", "d_model": 32, "d_kv": 16, "d_ff": 64, "num_layers": 1, "num_heads": 2,
           "vocab_size": V, "pad_token_id": 0, "eos_token_id": 3, "decoder_start_token_id": 0}


def family(name: str):
    """(module, batch) of each objective family, built outside the audit."""
    from ptm_app.objectives import (CausalLMModule, ContrastiveModule, MaskedLMModule, PermutationLMModule,
                                    ReplacedTokenDetectionModule, TranslationLMModule, UnifiedLMModule)
    from ptm_app.objectives.contrastive import DropoutPairCollator, NgramContextCollator
    from ptm_app.objectives.plm import PLMCollator
    from ptm_app.objectives.seq2seq import Seq2SeqCollator, Seq2SeqDenoisingModule
    from ptm_app.objectives.unilm import UniLMCollator

    bert = {**TINY_BERT, "vocab_size": V}
    word_start = torch.tensor([i < 5 or i % 3 != 0 for i in range(V)])
    if name == "mlm":
        return MaskedLMModule(backbone_config=bert).build(), mlm_collator()(examples())
    if name == "spanbert":
        from ptm_app.objectives.targets import MaskedLM, SpanBoundary

        module = MaskedLMModule(backbone_config=bert, targets=[MaskedLM(masking="span"), SpanBoundary()]).build()
        return module, mlm_collator(masking="span", word_start=word_start)(examples())
    if name == "clm":
        return CausalLMModule(backbone_config={**TINY_GPT2, "vocab_size": V}).build(), CLMCollator(0)(examples())
    if name == "xlnet":
        xlnet = {"model_type": "xlnet", "d_model": 32, "n_layer": 2, "n_head": 2, "d_inner": 64, "vocab_size": V}
        return (PermutationLMModule(backbone_config=xlnet).build(),
                PLMCollator(pad_token_id=0, special_ids=SPECIAL, seed=1)(examples()))
    if name in ("mass", "bart", "t5"):
        module = Seq2SeqDenoisingModule(backbone_config=TINY_T5 if name == "t5" else TINY_BART,
                                        noise="t5_span" if name == "t5" else name).build()
        collate = Seq2SeqCollator(pad_token_id=0, eos_token_id=3, mask_token_id=4, special_ids=SPECIAL,
                                  noise="t5_span" if name == "t5" else name, seed=1, sentinel_ids=tuple(range(50, 60)),
                                  full_stop_ids=(7,))
        return module, collate(examples())
    if name == "unilm":
        collate = UniLMCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=V, seed=1,
                                mode_weights={"seq2seq": 1.0})
        return UnifiedLMModule(backbone_config=bert).build(), collate(examples())
    if name == "tlm":
        xlm = {"model_type": "xlm", "emb_dim": 32, "n_layers": 2, "n_heads": 2, "max_position_embeddings": 64,
               "vocab_size": V, "n_langs": 2}
        pairs = [{**tlm_example([5 + i, 6, 7], [8, 9 + i], (0, 1), cls_id=2, sep_id=3, max_length=32), "key": (0, i)}
                 for i in range(4)]
        collate = TLMCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=V, seed=1,
                              mlm_probability=0.5)
        return TranslationLMModule(backbone_config=xlm).build(), collate(pairs)
    if name == "simcse":
        return (ContrastiveModule(backbone_config=bert, objective="simcse").build(),
                DropoutPairCollator(0, seed=1)(examples()))
    if name == "infoword":
        collate = NgramContextCollator(pad_token_id=0, mask_token_id=4, special_ids=SPECIAL, vocab_size=V, seed=1,
                                       cls_token_id=2, sep_token_id=3)
        return ContrastiveModule(backbone_config=bert, objective="infoword").build(), collate(examples())
    if name == "electra":
        return ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA).build(), mlm_collator()(examples())
    if name == "electra_two_stage":
        module = ReplacedTokenDetectionModule(backbone_config=TINY_ELECTRA, mode="two_stage", generator_size=1.0,
                                              generator_steps=1).build()
        module.start_discriminator_stage()
        return module, mlm_collator()(examples())
    raise ValueError(name)


FAMILIES = ["mlm", "spanbert", "clm", "xlnet", "mass", "bart", "t5", "unilm", "tlm", "simcse", "infoword", "electra",
            "electra_two_stage"]


def training_step(module, batch) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log outside a Trainer
        return module.training_step(batch, 0)


@pytest.mark.parametrize("name", FAMILIES)
def test_every_training_step_samples_with_generators_made_for_the_sampled_device(name, monkeypatch):
    module, batch = family(name)
    audit = SamplingAudit().install(monkeypatch)
    loss = training_step(module, batch)
    assert torch.isfinite(loss)
    assert audit.mismatches() == [], audit.calls
    if name.startswith("electra"):  # the one family that samples inside the model: G's replacements
        assert [call[0] for call in audit.calls] == ["multinomial"]


@pytest.mark.parametrize("name", ["electra", "electra_two_stage"])
def test_electra_samples_on_the_device_of_gs_logits(name, monkeypatch):
    """As in a GPU run: G's hidden states (and so its logits) live on the accelerator; the replacement generator
    must be made there (before the fix it was a CPU one, which CUDA refuses)."""
    module, batch = family(name)

    def on_accelerator(mod, args, output):
        output["last_hidden_state"] = output["last_hidden_state"].as_subclass(Elsewhere)
        return output

    module.generator.electra.register_forward_hook(on_accelerator)
    audit = SamplingAudit().install(monkeypatch)
    training_step(module, batch)
    assert [(call[0], call[2]) for call in audit.calls] == [("multinomial", torch.device("cuda", 0))]
    assert audit.mismatches() == [], audit.calls


MODEL_SIDE = ("objectives", "compression", "adaptation", "backbones", "training", "knowledge")


def model_side_files() -> list[Path]:
    """The packages whose code runs inside a LightningModule, on the accelerator (less ``knowledge/data.py``)."""
    return [p for d in MODEL_SIDE for p in sorted((ROOT / "ptm_app" / d).rglob("*.py")) if p.name != "data.py"]


def generator_calls(tree: ast.AST, inside: tuple[str, ...] = ()):
    """``(call, enclosing class names)`` of every ``torch.Generator(...)`` / ``draw_generator(...)``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("torch.Generator", "draw_generator"):
            yield node, inside
        yield from generator_calls(node, inside + ((node.name,) if isinstance(node, ast.ClassDef) else ()))


def test_model_side_code_names_the_device_of_every_generator():
    """Outside collators (data side: they run in the data loader and draw on the CPU), every generator is made
    with an explicit device: the device of the tensor it samples."""
    unnamed, seen = [], 0
    for path in model_side_files():
        for call, classes in generator_calls(ast.parse(path.read_text())):
            if any(name.endswith("Collator") for name in classes):
                continue
            seen += 1
            if not any(k.arg == "device" for k in call.keywords):
                unnamed.append(f"{path.relative_to(ROOT)}:{call.lineno} {ast.unparse(call)}")
    assert unnamed == []
    assert seen >= 3  # ELECTRA's replacements, Theseus's module draw, the throughput benchmark's matrices
