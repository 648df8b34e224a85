"""StepResult: what one simulated training step gives the user, and its JSON form."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

AXES = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True, slots=True)
class ErrorBand:
    """The likely measured step time of a prediction, from the errors of ``runs`` measured runs.

    ``low_s`` / ``high_s``: seconds; ``error_low_pct`` / ``error_high_pct``: the order statistics of
    those runs' signed errors (predicted vs measured, percent) that bound the band, ``error_median_pct``
    their median; ``coverage``: the share of new runs like these expected inside; ``basis``: which runs.
    ``simtrain.studies.uncertainty.band_for`` computes it; the type lives here, beside the result it is part
    of, so that the engine's result does not import a later stage (studies).
    """

    low_s: float
    high_s: float
    error_low_pct: float
    error_median_pct: float
    error_high_pct: float
    coverage: float
    runs: int
    basis: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with the field names."""
        return asdict(self)


@dataclass(slots=True)
class StageMemory:
    """Peak memory of one pipeline stage's ranks, with its components (bytes)."""

    stage: int
    peak_bytes: float
    components: dict[str, float]
    capacity_bytes: float
    closed_form_peak_bytes: float
    fits: bool
    timeline: Sequence[tuple[float, float]] = field(default_factory=list, repr=False)
    """(time s, bytes) of the stage's busiest rank; under the steady-state shortcut its repeating periods
    are stored once (``steady.PeriodicTimeline``): iterate it, or ``list()`` it for every point."""


@dataclass(slots=True)
class StepResult:
    """One simulated optimizer step.

    Times in seconds, throughput in tokens/s, FLOP rates in TFLOP/s per GPU (1e12), memory in bytes.
    MFU uses model FLOPs (``simtrain.lower.flops``); HFU uses the hardware FLOPs the kernels execute.
    """

    name: str
    mode: str
    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    n_gpus: int
    global_batch_tokens: int
    microbatches: int
    breakdown_s: dict[str, Any]
    memory: list[StageMemory]
    fits: bool
    layout: dict[str, Any]
    ops_executed: int
    notes: list[str] = field(default_factory=list)
    error_band: ErrorBand | None = None
    """Likely measured step time from simtrain's error on measured runs like this one (``simtrain.studies.uncertainty``)."""
    whatif: dict[str, Any] | None = None
    """A what-if's step with and without its perturbations (``simtrain.studies.whatif.summary``); None: no what-if."""
    variability: dict[str, Any] | None = None
    """The step time's percentiles over seeded draws of every GPU's speed (``simtrain.studies.variability``);
    None: no ``sim.variability``."""
    trace: list[Any] = field(default_factory=list, repr=False)
    stage_of: dict[int, int] = field(default_factory=dict, repr=False)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        """JSON-ready dict with the documented keys (memory timelines only when asked)."""
        skip = (("trace", "stage_of", "memory", "error_band") + (("whatif",) if self.whatif is None else ())
                + (("variability",) if self.variability is None else ()))
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["error_band"] = self.error_band.to_dict() if self.error_band is not None else None
        out["memory"] = []
        for m in self.memory:
            d = {"stage": m.stage, "peak_bytes": m.peak_bytes, "components": m.components,
                 "capacity_bytes": m.capacity_bytes, "closed_form_peak_bytes": m.closed_form_peak_bytes,
                 "fits": m.fits}
            if timeline:
                d["timeline"] = list(m.timeline)
            out["memory"].append(d)
        return out
