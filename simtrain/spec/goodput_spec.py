"""What a run says about failures and checkpoints (``run.failures``, ``run.checkpoint``), and the public
figures behind their defaults; the goodput model that uses them is ``simtrain.studies.goodput``."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

GB = 1e9
S_PER_HOUR = 3600.0

# Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, sec. 3.3.4, Table 5): 419
# unexpected interruptions in a 54-day snapshot of 405B pre-training on 16,384 H100 GPUs:
# 419 / (54 d x 24 h/d x 16,384 GPUs) = 419 / 21,233,664 GPU-hours = 1.973e-5 failures per GPU-hour
# (a job MTBF of 3.09 h at 16,384 GPUs).
LLAMA3_FAILURES_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
LLAMA3_FAILURES_SOURCE = ("Llama 3 (arXiv:2407.21783 sec. 3.3.4): 419 unexpected interruptions in 54 days on "
                          "16,384 H100s = 1.97e-5 per GPU-hour")
# Llama 3 sec. 3.3.1 (Storage): Tectonic "supports a sustainable throughput of 2 TB/s" for the 16,384-GPU
# (2,048-node) job: 2e12 / 2048 = 0.98 GB/s per node.
LLAMA3_WRITE_GBPS_PER_NODE = 2e12 / 2048 / GB
DEFAULT_RESTART_S = 600.0
"""Assumption (no public figure at this scale): 10 min from a failure to training again, before the reload."""


class FailureSpec(BaseModel):
    """Failures of a run (``run.failures``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    per_gpu_hour: float = Field(LLAMA3_FAILURES_PER_GPU_HOUR, ge=0, lt=1)
    """Job-interrupting failures per GPU-hour (default: the Llama 3 405B run's, 1.97e-5; 0: none)."""
    restart_s: float = Field(DEFAULT_RESTART_S, ge=0, le=30 * 86400)
    """Seconds from a failure to training again (detection, rescheduling, initialisation), not counting the
    checkpoint reload (default 600 s, an assumption)."""


class CheckpointSpec(BaseModel):
    """Checkpointing of a run (``run.checkpoint``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    interval: float | Literal["auto"] = "auto"
    """Seconds of training between checkpoints, or ``auto``: Daly's optimum (see the module docstring)."""
    interval_steps: int | None = Field(None, gt=0)
    """Optimizer steps between checkpoints (instead of ``interval``; converted at the run's mean step time)."""
    write_GBps_per_node: float = Field(LLAMA3_WRITE_GBPS_PER_NODE, gt=0, le=1e4)
    """Storage write bandwidth of one node, GB/s (default 0.98: Llama 3's 2 TB/s over 2,048 nodes)."""
    read_GBps_per_node: float | None = Field(None, gt=0, le=1e4)
    """Storage read bandwidth of one node for the reload, GB/s (None: the write bandwidth)."""
    mode: Literal["sync", "async"] = "sync"
    """``sync``: training waits for the write; ``async``: only for the device-to-host snapshot."""

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and not (0 < value < math.inf):
            raise ValueError("give seconds of training between checkpoints (> 0) or 'auto'")
        return value
