"""torch DTensor sequence parallelism saves the all-gathered input of its column-parallel linears.

``data/dtensor_sp_probe.py`` runs a torchtitan-style feed-forward block (RMSNorm under
SequenceParallel, the input gathered once to Replicate, column-parallel w1/w3, row-parallel w2) on two
gloo ranks and lists what autograd saved inside the feed-forward. The MLP input is kept whole (the
full sequence, one storage shared by w1 and w3), not the sequence shard Megatron-core keeps: the fact
behind ``ActivationShape.gathered_inputs`` (simtrain/lower/memory.py), which counts the QKV and MLP inputs
whole for DTensor stacks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from simtrain.lower.memory import ActivationShape, weight_grad_input_bytes  # noqa: E402
from simtrain.spec.model import ModelSpec  # noqa: E402

PROBE = Path(__file__).parent / "data" / "dtensor_sp_probe.py"
B, S, H, F, T = 2, 16, 24, 40, 2


def test_column_parallel_linears_save_the_gathered_input() -> None:
    proc = subprocess.run([sys.executable, str(PROBE), str(B), str(S), str(H), str(F)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = json.loads(proc.stdout.strip().splitlines()[-1])
    assert saved.count(B * S * H) == 1  # the gathered MLP input, shared by w1 and w3
    assert B * S * H // T not in saved  # not its sequence shard
    # eager SwiGLU on the full sequence: w1 out, silu(w1 out), w3 out, the product (w2's input)
    assert sorted(saved) == sorted([B * S * F // T] * 4 + [B * S * H])
    # the model counts the two linear inputs (QKV, MLP) whole under gathered_inputs: per input,
    # tokens x h elements instead of tokens x h / t
    spec = ModelSpec(name="probe", n_layers=1, hidden=H, n_heads=4, ffn_hidden=F, activation="swiglu",
                     norm="rmsnorm", position="rope", vocab=64, max_position=S, tied_embeddings=False,
                     linear_bias=False)
    shard = ActivationShape(b=B, s=S, t=T, sp=True, flash=True, dropout=False)
    whole = ActivationShape(b=B, s=S, t=T, sp=True, flash=True, dropout=False, gathered_inputs=True)
    extra_elements = (weight_grad_input_bytes(spec, whole) - weight_grad_input_bytes(spec, shard)) / 2 / 2
    assert extra_elements == pytest.approx(B * S * H - B * S * H // T)
