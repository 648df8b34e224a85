"""``sim.variability``: seeded GPU-to-GPU speed variability, reported as percentiles of the step time.

GPUs of one SKU do not run at one speed: under the same power cap, silicon, cooling and clocks differ, and a
synchronous training step waits at every collective for its slowest member. Sinha et al. (SC'22, "Not All
GPUs Are Created Equal", arXiv 2208.11035) measured same-SKU GPUs of production clusters and found an average
performance variation of 8 % (up to 22 %) between them, with outliers 1.5x slower [obs]. The nominal
simulation gives every GPU the profile's speed; with ``sim.variability`` simtrain also draws each GPU's
speed (``simtrain.studies.variability``), simulates the step once per draw, and reports the step time's
percentiles over the draws, seeded by ``sim.seed`` (the same seed gives the same numbers, bit for bit).

No default spread is assumed: the coefficient of variation is the user's (measured on their cluster, e.g.
the spread of one GEMM's time over its GPUs); absent, nothing is drawn and the step is the nominal one.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)

#: Most draws one simulation may take: each draw simulates the step once more (bounded run time).
MAX_SAMPLES = 256
#: Largest coefficient of variation accepted: at 0.25 a GPU 4 standard deviations slow has no speed left.
MAX_CV = 0.2


class VariabilitySpec(BaseModel):
    """Per-GPU compute speed drawn around the profile's (``sim.variability``)."""

    model_config = _STRICT
    gpu_speed_cv: float = Field(gt=0, le=MAX_CV)
    """Coefficient of variation of a GPU's compute speed (standard deviation / mean, dimensionless): each
    GPU's speed factor is drawn from a normal distribution of mean 1 and this standard deviation, so its
    compute ops take 1/factor as long."""
    samples: int = Field(16, ge=1, le=MAX_SAMPLES)
    """Draws (one simulated step each) behind the reported percentiles."""
