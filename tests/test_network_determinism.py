"""Same input, same output, also within one process (issue 31; found by the fuzz campaign, seed 11 case 240).

Flows hash by identity, so a set of them iterates in the order of the addresses the allocator hands out.
The network used to schedule the completions of a connected set of flows in that order: two flows ending
at the same instant then fired in either order, and the engine charged a wait that both ended to one axis
or the other (the same step time, a different breakdown on a second ``simulate()`` in the same process).
"""

from __future__ import annotations

import json

import simpy

from simtrain.engine.network import FlowNetwork
from simtrain.studies.simulate import simulate

# the fuzz case, as the campaign generated it (benchmarks/fuzz.py --seed 11 --case 240)
CASE_240 = {
    "name": "fuzz",
    "model": {"name": "fuzz", "n_layers": 16, "hidden": 1024, "n_heads": 8, "n_kv_heads": None,
              "ffn_hidden": 1376, "activation": "gelu", "norm": "layernorm", "position": "learned",
              "max_position": 4096, "vocab": 1000, "tied_embeddings": False, "linear_bias": True},
    "hardware": {"node": "dgx-b300", "n_nodes": 8},
    "layout": {"tp": 1, "cp": 4, "pp": 2, "dp": 8, "vpp": 4, "schedule": "interleaved_1f1b",
               "sequence_parallel": False, "zero_stage": 3, "recompute": "op_sac", "cp_comm": "a2a"},
    "train": {"seq_len": 256, "micro_batch_size": 4, "precision": "fp8", "stack": "megatron-core",
              "global_batch_tokens": 32768, "fp8_recipe": "current", "grad_dtype": "bf16"},
}


def test_connected_flows_come_back_in_start_order() -> None:
    env = simpy.Environment()
    net = FlowNetwork(env, lambda e: 1e9)
    edge = ("a", "b")
    net.transfer([((edge,), (1.0,), 1e6 * (i + 1), float("inf")) for i in range(64)])
    flows = net._component(list(net._on_edge[edge]))
    assert [f.seq for f in flows] == list(range(64))


def test_simulating_twice_in_one_process_gives_identical_json() -> None:
    runs = [json.dumps(simulate(CASE_240).to_dict(timeline=True)) for _ in range(4)]
    assert all(r == runs[0] for r in runs[1:])
