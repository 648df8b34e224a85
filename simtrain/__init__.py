"""simtrain: a discrete-event simulator of distributed LLM training.

``simulate(config) -> StepResult`` predicts step time, throughput, MFU and per-stage memory of one
training step for a model, a cluster and a parallel layout.
"""

from simtrain.engine.results import StepResult
from simtrain.plan.load import load_config
from simtrain.spec.config import HardwareConfig, LayoutConfig, RunConfig, SimConfig, TrainConfig
from simtrain.spec.errors import ConfigError, InfeasibleLayout, SimtrainError
from simtrain.spec.hf_config import from_hf_config
from simtrain.spec.model import ModelSpec, list_presets, preset
from simtrain.studies.simulate import simulate

__all__ = [
    "ConfigError", "HardwareConfig", "InfeasibleLayout", "LayoutConfig", "ModelSpec", "RunConfig", "SimConfig",
    "SimtrainError", "StepResult", "TrainConfig", "from_hf_config", "list_presets", "load_config", "preset",
    "simulate",
]
__version__ = "0.1.0"
