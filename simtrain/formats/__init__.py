"""Users' formats in and out: Megatron-LM / NeMo arguments and torchtitan TOML job configs.

``read_megatron``/``read_torchtitan`` (and their ``*_file`` forms) map a framework's config onto a
``RunConfig`` and return an ``Imported`` (the config, plus the flags or keys not used); ``write_megatron``/
``write_torchtitan`` write any RunConfig's model, layout and batch back in the framework's format. Hugging
Face ``config.json`` models are ``simtrain.spec.hf_config``.
"""

from simtrain.formats.common import Imported
from simtrain.formats.megatron import read_megatron, read_megatron_file
from simtrain.formats.megatron_export import write_megatron
from simtrain.formats.torchtitan import read_torchtitan, read_torchtitan_file, write_torchtitan

__all__ = ["Imported", "read_megatron", "read_megatron_file", "read_torchtitan", "read_torchtitan_file",
           "write_megatron", "write_torchtitan"]  # fmt: skip
