"""Pure, seeded corruption functions on token ids (docs/design.md principle 1: corruption is data, not model)."""
from ptm_app.data.corruption.masking import draw_generator, draw_rng, mlm_mask, static_key

__all__ = ["draw_generator", "draw_rng", "mlm_mask", "static_key"]
