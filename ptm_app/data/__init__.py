"""Data: sources, prepared corpora, data modules, collators and the corruption functions of the objectives."""
IGNORE_INDEX = -100  # a position without a target: torch's cross_entropy ignore_index default, transformers' labels
