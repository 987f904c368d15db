"""One LightningModule per adaptation style; fine-tuning strategies are settings and callbacks."""
from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.adaptation.features import FeatureExtractionModule

__all__ = ["FeatureExtractionModule", "SequenceClassificationModule"]
