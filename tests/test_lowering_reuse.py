"""Work reused within one lowering (CI time): the emitter's memos make a layer's kernel tuples the same
objects every micro-batch, and ``cost_pass.lower`` costs all stages with one memo. Both must give the
same program, op for op, as costing each op's kernels afresh."""

from __future__ import annotations

import copy

from simtrain.cost.cost_pass import _Memo, cost_program, lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.load import load_gpu
from simtrain.lower.kernels import Sliced
from simtrain.lower.lowering import lower_program
from simtrain.lower.ops import ComputeOp, CostedComputeOp, Program
from simtrain.plan.load import load_config

#: TP 2 with comm overlap (sliced GEMM chunks, split head/mid/tail segments), PP 2 with 8 micro-batches
DENSE = {"model": {"preset": "llama3-8b", "n_layers": 4}, "hardware": {"node": "dgx-h100", "n_nodes": 1},
         "layout": {"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True, "tp_comm_overlap": True, "zero_stage": 1},
         "train": {"seq_len": 2048, "global_batch_seqs": 16}}


def _fresh(program: Program, source: ComputeCostModel) -> Program:
    """``program`` costed with every op's kernel tuple copied (no tuple shared with another op) and a
    memo of its own: the reference the shared memos must reproduce."""
    copied = Program(program.stage, [copy.copy(op) for op in program.ops], dict(program.static_mem))
    for op in copied.ops:
        if type(op) is ComputeOp:
            op.kernels = tuple(copy.copy(k) for k in op.kernels)
    return cost_program(copied, source, _Memo(source))


def test_emitted_kernel_tuples_are_shared_and_costed_as_fresh_ones() -> None:
    run = load_config(copy.deepcopy(DENSE))
    source = ComputeCostModel(load_gpu("h100-sxm"), run.train.precision)
    neutral = lower_program(run)
    computes = [op for p in neutral.programs for op in p.ops if type(op) is ComputeOp and op.kernels]
    sliced = [op for op in computes if any(isinstance(k, Sliced) for k in op.kernels)]
    assert sliced, "the config should pipeline TP collectives with sliced GEMMs"
    # one tuple object per distinct segment, not one per micro-batch: 16 micro-batches / dp 2 = 8 each
    assert len({id(op.kernels) for op in computes}) * 4 <= len(computes)
    costed = lower(run, source)
    for shared, plain in zip(costed.programs, neutral.programs, strict=True):
        fresh = _fresh(plain, source)
        assert len(shared.ops) == len(fresh.ops)
        for a, b in zip(shared.ops, fresh.ops, strict=True):
            assert a == b  # every field: kernels, times (repr-equal floats), deps, memory
            if isinstance(a, CostedComputeOp):
                assert repr(a.duration_s) == repr(b.duration_s)
