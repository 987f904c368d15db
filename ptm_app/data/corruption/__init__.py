"""Pure, seeded corruption functions on token ids (DESIGN principle 1: corruption is data, not model)."""
from ptm_app.data.corruption.masking import IGNORE_INDEX, draw_generator, draw_rng, mlm_mask

__all__ = ["IGNORE_INDEX", "draw_generator", "draw_rng", "mlm_mask"]
