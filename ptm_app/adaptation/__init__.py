"""One LightningModule per adaptation style; fine-tuning strategies are settings and callbacks."""
from ptm_app.adaptation.classification import SequenceClassificationModule
from ptm_app.adaptation.features import FeatureExtractionModule
from ptm_app.adaptation.prompting import InContextEvalModule, PromptClassifierModule
from ptm_app.adaptation.qa import QuestionAnsweringModule
from ptm_app.adaptation.token_classification import TokenClassificationModule

__all__ = ["FeatureExtractionModule", "InContextEvalModule", "PromptClassifierModule", "QuestionAnsweringModule", "SequenceClassificationModule",
           "TokenClassificationModule"]
