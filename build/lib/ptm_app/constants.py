"""Values every layer agrees on."""
IGNORE_INDEX = -100  # a position without a target: torch's cross_entropy ignore_index default, transformers' labels
