"""Commands that run or collect many runs and write their tables, never typed by hand.

- ``sweep``: a grid of configs (fit + test), one run directory per cell, then its results table.
- ``report``: a results table (Markdown + CSV) from run directories' ``summary.json`` files.
- ``knowledge_report``: knowledge-enhanced pre-trainings side by side: pre-train, export, probe, fine-tune.
- ``compression_report``: the compression table (Qiu et al. 2020, Table 3) measured from trained models.
"""
