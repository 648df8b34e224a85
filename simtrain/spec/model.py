"""Models: the spec (``simtrain.spec.model_spec``), the presets (``simtrain.spec.model_presets``) and the Hugging
Face ``config.json`` reader (``simtrain.spec.hf_config``), under the one name existing code imports.

A model's layers are described once (``ModelSpec.layer`` -> ``simtrain.spec.layer_desc.LayerDesc``);
parameter counts, model FLOPs and saved activations are derived from that description.
"""

from __future__ import annotations

from simtrain.spec.hf_config import from_hf_config
from simtrain.spec.model_presets import list_presets, preset, preset_table
from simtrain.spec.model_spec import AttentionKind, MLASpec, ModelSpec, MoESpec

__all__ = [
    "AttentionKind",
    "MLASpec",
    "ModelSpec",
    "MoESpec",
    "from_hf_config",
    "list_presets",
    "preset",
    "preset_table",
]
