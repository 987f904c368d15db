"""One LightningModule per adaptation style."""
from ptm_app.adaptation.classification import SequenceClassificationModule

__all__ = ["SequenceClassificationModule"]
