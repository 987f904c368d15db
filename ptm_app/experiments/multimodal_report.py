"""``python main.py multimodal PLAN.yaml [--collect_only] [--readme docs/results/multimodal.md]``: the image–text
models evaluated on emoji never seen in training (issue 31; docs/multimodal.md), from the runs, never typed.

The plan is a sweep plan (``experiments.sweep``: ``configs/sweeps/multimodal_emoji.yaml``) of CLIP-style runs
(``objectives.clip``); its cells are fitted (resumed, skipped when done) and each run's ``last.ckpt`` is evaluated on
the held-out concepts of the test split, per drawing style, beside the same model untrained (built with the run's
seed: the random-init floor):

- image→text and text→image recall@1/5/10: the gallery is every test concept drawn in that style (its base emoji,
  no skin-tone variant) and the captions are their names; a hit is the true name (image→text) or picture
  (text→image) among the top k by cosine similarity (CLIP §3.1.3 / Table 13's retrieval protocol);
- zero-shot classification (CLIP §3.1.2): each picture is given the OpenMoji group (and subgroup) whose prompt
  "an emoji of {name}" ("face-smiling" read as "face smiling") is nearest; every group / subgroup of the set is a
  candidate;
- cross-style transfer: a run trained on one style (``data.init_args.styles``) tested on the others.

Rows with several seeds give the mean and a 95 % Student-t interval over the seeds (``experiments.stats.summarize``); one seed is
one observation.  The table goes to ``<runs>/<plan>/multimodal.md`` (+ .csv, .json) with ``multimodal.png`` (a few
retrievals of the first run), and, with ``--readme``, between ``<!-- <plan name>:start/end -->`` in that file.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ptm_app.errors import PtmError

KS = (1, 5, 10)
PROMPT = "an emoji of {}"


def seed_interval(values: list[float]) -> tuple[float, Optional[float]]:
    """Mean and the half-width of the 95 % Student-t interval over seeds (``experiments.stats.summarize``; None for
    one seed: an observation)."""
    from ptm_app.experiments.stats import summarize

    summary = summarize(values)
    return summary.mean, None if summary.interval is None else (summary.interval[1] - summary.interval[0]) / 2


def recall_at(similarity: torch.Tensor, ks: tuple[int, ...] = KS) -> dict[int, float]:
    """Share of rows whose true column (row i: column i) ranks among the top k (ties count against the row)."""
    truth = similarity.diagonal().unsqueeze(1)
    rank = (similarity > truth).sum(1) + (similarity == truth).sum(1) - 1  # 0 = first
    return {k: (rank < k).float().mean().item() for k in ks}


def prompt(name: str) -> str:
    return PROMPT.format(name.replace("-", " "))


@torch.no_grad()
def image_features(module, pixels: torch.Tensor, size: int, batch: int = 256) -> torch.Tensor:
    """L2-normalised projected image features of uint8 ``(N, H, W, 3)`` pictures (resized to ``size``)."""
    from ptm_app.data.image_text import normalise, resize

    out = []
    for start in range(0, len(pixels), batch):
        x = torch.stack([resize(img, size) for img in normalise(pixels[start:start + batch])])
        out.append(module.image_embeds(x.to(module.device)).float())
    return torch.nn.functional.normalize(torch.cat(out), dim=-1)


@torch.no_grad()
def text_features(module, tokenizer, texts: list[str], max_length: int, batch: int = 256) -> torch.Tensor:
    """L2-normalised projected caption features."""
    out = []
    for start in range(0, len(texts), batch):
        enc = tokenizer(texts[start:start + batch], truncation=True, max_length=max_length, padding=True,
                        return_tensors="pt").to(module.device)
        out.append(module.text_embeds(enc["input_ids"], enc["attention_mask"]).float())
    return torch.nn.functional.normalize(torch.cat(out), dim=-1)


def evaluate(module, tokenizer, root: Path, style: str, size: int, max_length: int) -> dict:
    """Retrieval and zero-shot metrics on the test concepts drawn in ``style`` (see the module docstring)."""
    from ptm_app.data.image_text import load_pixels, read_records

    records = [r for r in read_records(root, "test") if r["style"] == style and not r.get("skin_tone")]
    if not records:
        raise PtmError(f"{root}: no test pictures in style {style!r}")
    everything = [r for split in ("train", "validation", "test") for r in read_records(root, split)]
    pixels = load_pixels(root)[[r["image"] for r in records]]
    module.eval()
    images = image_features(module, pixels, size)
    texts = text_features(module, tokenizer, [r["caption"] for r in records], max_length)
    sim = images @ texts.T
    out = {f"i2t_R@{k}": v for k, v in recall_at(sim).items()}
    out.update({f"t2i_R@{k}": v for k, v in recall_at(sim.T).items()})
    for field in ("group", "subgroup"):
        names = sorted({r[field] for r in everything})
        classes = text_features(module, tokenizer, [prompt(n) for n in names], max_length)
        guess = (images @ classes.T).argmax(1).tolist()
        out[f"zero_shot_{field}"] = float(np.mean([names[g] == r[field] for g, r in zip(guess, records)]))
        out[f"{field}_classes"] = len(names)
    out["concepts"] = len(records)
    return out


def chance(concepts: int, groups: int, subgroups: int) -> dict:
    """What a model that ranks at random scores (recall@k = k / concepts) and a uniform guess of the class."""
    out = {f"{d}_R@{k}": min(1.0, k / concepts) for d in ("i2t", "t2i") for k in KS}
    return {**out, "zero_shot_group": 1 / groups, "zero_shot_subgroup": 1 / subgroups}


def random_init(module, seed: int):
    """The same dual encoder untrained: built from its resolved config with ``seed`` (the floor)."""
    from ptm_app.objectives.clip import DualEncoderModule

    torch.manual_seed(seed)
    fresh = DualEncoderModule(backbone_config=module.backbone.config.to_dict(),
                              max_logit_scale=module.max_logit_scale).build()
    fresh.tokenizer = module.tokenizer
    return fresh.eval()


def run_settings(run: Path) -> dict:
    """A run's seed, data source, training styles, image size and caption length (its ``config.yaml``)."""
    import yaml

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    data = (cfg.get("data") or {}).get("init_args") or {}
    return {"seed": int(cfg.get("seed_everything") or 0), "source": data.get("source", "emoji"),
            "styles": data.get("styles"), "image_size": int(data.get("image_size", 64)),
            "max_length": int(data.get("max_length", 32))}


def evaluate_run(run: Path) -> list[dict]:
    """One row per (model: trained / random init, test style) of a finished run."""
    from ptm_app.data.image_text import image_source, read_records
    from ptm_app.objectives.clip import DualEncoderModule

    ckpt = run / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        raise PtmError(f"{run}: no checkpoints/last.ckpt; run the plan (without --collect_only) first")
    settings = run_settings(run)
    root = image_source(settings["source"])
    trained = DualEncoderModule.load_from_checkpoint(ckpt, map_location="cpu").eval()
    floor = random_init(trained, settings["seed"])
    styles = sorted({r["style"] for r in read_records(root, "test")})
    trained_on = "+".join(settings["styles"] or styles)
    rows = []
    for label, module in (("CLIP-style, trained", trained), ("same model, random init", floor)):
        for style in styles:
            metrics = evaluate(module, module.tokenizer, root, style, settings["image_size"], settings["max_length"])
            rows.append({"model": label, "trained on": trained_on, "tested on": style, "seed": settings["seed"],
                         "run": run.name, **metrics})
    return rows


METRICS = [f"{d}_R@{k}" for d in ("i2t", "t2i") for k in KS] + ["zero_shot_group", "zero_shot_subgroup"]


def summarise(rows: list[dict]) -> list[dict]:
    """Rows grouped by (model, trained on, tested on): each metric as ``mean ± half-width`` over the seeds."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["trained on"], row["tested on"]), []).append(row)
    out = []
    for (model, trained_on, tested_on), members in groups.items():
        line = {"model": model, "trained on": trained_on, "tested on": tested_on, "seeds": len(members),
                "concepts": members[0]["concepts"]}
        for metric in METRICS:
            mean, half = seed_interval([m[metric] for m in members])
            line[metric] = f"{mean:.3f}" if half is None else f"{mean:.3f} ± {half:.3f}"
            line[f"{metric}_mean"] = mean
        out.append(line)
    for style in sorted({r["tested on"] for r in rows}):
        first = next(r for r in rows if r["tested on"] == style)
        line = {"model": "chance", "trained on": "", "tested on": style, "seeds": "", "concepts": first["concepts"]}
        for metric, value in chance(first["concepts"], first["group_classes"], first["subgroup_classes"]).items():
            line[metric], line[f"{metric}_mean"] = f"{value:.3f}", value
        out.append(line)
    return out


def draw(run: Path, n: int = 6, top: int = 3):
    """A figure: ``n`` test pictures (OpenMoji style) of ``run``'s model with its top captions (the true one bold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ptm_app.data.image_text import image_source, load_pixels, read_records
    from ptm_app.objectives.clip import DualEncoderModule

    settings = run_settings(run)
    root = image_source(settings["source"])
    module = DualEncoderModule.load_from_checkpoint(run / "checkpoints" / "last.ckpt", map_location="cpu").eval()
    records = [r for r in read_records(root, "test") if not r.get("skin_tone")]
    style = "openmoji" if any(r["style"] == "openmoji" for r in records) else records[0]["style"]
    records = [r for r in records if r["style"] == style]
    pixels = load_pixels(root)[[r["image"] for r in records]]
    sim = image_features(module, pixels, settings["image_size"]) @ text_features(
        module, module.tokenizer, [r["caption"] for r in records], settings["max_length"]).T
    picks = np.random.default_rng(0).choice(len(records), size=min(n, len(records)), replace=False)
    fig, axes = plt.subplots(1, len(picks), figsize=(2.6 * len(picks), 3.2))
    for ax, i in zip(np.atleast_1d(axes), picks):
        ax.imshow(pixels[i].numpy())
        ax.set_xticks([]), ax.set_yticks([])
        best = sim[i].topk(min(top, sim.size(1))).indices.tolist()
        lines = [("✓ " if j == i else "") + records[j]["caption"][:24] for j in best]
        ax.set_title(f"true: {records[i]['caption'][:24]}", fontsize=7)
        ax.set_xlabel("\n".join(f"{rank + 1}. {text}" for rank, text in enumerate(lines)), fontsize=7)
    fig.suptitle(f"image→text retrieval among {len(records)} held-out emoji ({run.name})", fontsize=9)
    fig.tight_layout()
    return fig


COLUMNS = ["model", "trained on", "tested on", "seeds", "concepts", *METRICS]


def multimodal(plan: str, collect_only: bool = False, readme: Optional[str] = None,
               figure: Optional[str] = None) -> int:
    """Train (resumable) and evaluate the plan's image–text runs; write the retrieval / zero-shot table.

    Args:
        plan: a sweep plan of CLIP-style runs, e.g. configs/sweeps/multimodal_emoji.yaml.
        collect_only: run nothing: evaluate the runs there are.
        readme: also put the table into this file between <!-- <plan name>:start --> and <!-- <plan name>:end -->.
        figure: also save the retrievals figure here (e.g. docs/figures/multimodal_emoji.png).
    """
    from ptm_app.analysis.figures import save_png
    from ptm_app.analysis.tables import write_table
    from ptm_app.experiments.sweep import current_cells, load_plan, run_cell
    from ptm_app.paths import require_markers, runs_root, write_between_markers, write_json

    plan_path, plan = plan, load_plan(plan)
    if readme:
        require_markers(readme, plan["name"])
    plan["test"] = False  # evaluated here
    failed = []
    if not collect_only:
        failed = [c["name"] for c in plan["cells"] if run_cell(plan, c)]
    current, stale = current_cells(plan)
    if stale:
        print(f"left out: {len(stale)} run(s) made by an earlier recipe of their cell ({', '.join(stale)}); "
              f"run the plan without --collect_only to remake them")
    done = [r for r in current.values() if (r / "checkpoints" / "last.ckpt").is_file()]
    if not done:
        raise PtmError(f"{plan_path}: none of its runs has a checkpoint made by its current recipe yet; run it "
                       f"without --collect_only")
    rows = [row for run in done for row in evaluate_run(run)]
    table = summarise(rows)
    out = runs_root() / plan["name"]
    write_json(out / "multimodal_rows.json", rows)
    md = write_table(table, COLUMNS, out / "multimodal",
                     f"Image-text retrieval and zero-shot classification on held-out emoji ({plan['name']})")
    fig = draw(done[0])
    save_png(fig, out / "multimodal.png")
    if figure:
        save_png(fig, Path(figure))
    print(md.read_text(encoding="utf-8"), end="")
    if readme:
        write_between_markers(readme, plan["name"], md.read_text(encoding="utf-8"))
    print(f"wrote {md} (+ .csv, .json), {out / 'multimodal.png'}" + (f", {figure}" if figure else ""))
    if failed:
        raise PtmError(f"multimodal: {len(failed)} run(s) failed: {', '.join(failed)}; see their output above")
    return 0
