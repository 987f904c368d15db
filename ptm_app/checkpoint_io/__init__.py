"""Checkpoint files: read as data (``reading``), written atomically (``writing``), and the module classes they may
name (``module_classes``).  The layer below the models, which load backbones, teachers and ``init_from`` weights
from checkpoints (docs/design.md principles 10 and 11)."""
