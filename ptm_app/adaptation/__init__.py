"""One LightningModule per adaptation style; fine-tuning strategies are settings and callbacks."""
from ptm_app.adaptation.choice import MultipleChoiceModule
from ptm_app.adaptation.classification import SequenceClassificationModule, SequenceRegressionModule
from ptm_app.adaptation.compressed import (DistillationModule, EarlyExitModule, PruningModule, QuantAwareModule,
                                          TheseusModule)
from ptm_app.adaptation.features import FeatureExtractionModule, QAFeatureExtractionModule, TokenFeatureExtractionModule
from ptm_app.adaptation.generation import GenerationModule
from ptm_app.adaptation.multitask import MultitaskModule
from ptm_app.adaptation.prompting import InContextEvalModule, PromptClassifierModule
from ptm_app.adaptation.qa import QuestionAnsweringModule
from ptm_app.adaptation.token_classification import TokenClassificationModule

__all__ = ["DistillationModule", "EarlyExitModule", "FeatureExtractionModule", "GenerationModule", "InContextEvalModule",
           "MultipleChoiceModule", "MultitaskModule", "PromptClassifierModule", "PruningModule",
           "QAFeatureExtractionModule", "QuantAwareModule", "QuestionAnsweringModule", "SequenceClassificationModule",
           "SequenceRegressionModule", "TheseusModule", "TokenClassificationModule", "TokenFeatureExtractionModule"]
