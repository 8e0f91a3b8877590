"""`gradwire predict`: step time, throughput and scaling efficiency on N ranks, bucket by bucket.

- :mod:`.timeline`: :class:`StepProfile`, one rank's step and its DDP buckets;
- :mod:`.simulate`: the step replayed on the network model (link queue, overlap);
- :mod:`.plans`: which collectives a strategy issues per bucket;
- :mod:`.codec`: compressed bytes and compression time;
- :mod:`.model`: :func:`predict`, :func:`calibrated`, :func:`ratio_needed`, :func:`sweep`;
- :mod:`.describe`: a profile from a model factory on the meta device and a given compute time;
- :mod:`.recorded`: a profile from what ``gradwire profile`` recorded;
- :mod:`.measure`: a profile from a short loopback run of a bundled model.
"""
from gradwire.predict.model import (
    MAX_RATIO, NONE_NEEDED, NOT_REACHABLE, Prediction, Pricers, calibrated, check_fits, default_worlds, predict,
    ratio_needed, sweep,
)
from gradwire.predict.simulate import Epochs
from gradwire.predict.timeline import Bucket, MeasuredExchange, StepProfile

__all__ = ["MAX_RATIO", "NONE_NEEDED", "NOT_REACHABLE", "Bucket", "Epochs", "MeasuredExchange", "Prediction", "Pricers",
           "StepProfile", "calibrated", "check_fits", "default_worlds", "predict", "ratio_needed", "sweep"]
