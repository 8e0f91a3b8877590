"""`gradwire predict`: step time and scaling efficiency on N ranks from a short measured run."""
from gradwire.predict.measure import measure_profiles, pooled_median, profile_from_result
from gradwire.predict.model import Collective, Prediction, StepProfile, predict, predict_many

__all__ = ["Collective", "Prediction", "StepProfile", "measure_profiles", "pooled_median", "predict", "predict_many",
           "profile_from_result"]
