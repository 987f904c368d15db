"""Understanding what a pre-trained model learned (issue 15).

- ``plot``: training curves of run directories (``logs/metrics.csv``) in one PNG.
- ``representations``: every layer's hidden states of a frozen backbone, computed once and cached (safetensors).
- ``probing``: layer-wise probes, control tasks, scalar mix and center of gravity (Tenney et al. 2019;
  Hewitt & Liang 2019).
- ``contextuality``: self-similarity, intra-sentence similarity, maximum explainable variance and anisotropy
  per layer (Ethayarajh 2019).
- ``attention``: per-head entropy, attention to [CLS]/[SEP]/punctuation and distance (Clark et al. 2019).
- ``knowledge_probe`` (facts from ``knowledge_facts``): LAMA cloze queries, P@1/P@10/MRR (Petroni et al. 2019).
- ``robustness`` (text edits in ``perturbations``): a fine-tuned classifier on typo / word-dropout / synonym
  perturbed copies of its test set.

Every command is a plain typed function in the command table (``ptm_app.main``: a YAML ``--config`` or flags);
results are tables (Markdown + CSV + JSON, ``tables``) and PNGs (``figures``) in one output directory.
"""
