"""Checkpoint files read as data (``files``) and the module classes they may name (``module_classes``): the layer
below the models, which load backbones, teachers and ``init_from`` weights from checkpoints (docs/design.md
principles 10 and 11)."""
