"""ZeRO-1/2's overlapped parameter all-gather (Megatron --overlap-param-gather): buckets in forward order, each
unit's first forward waiting only for the buckets that carry its parameters (``lowering._param_gathers_at_start``,
``_StageLowering._gathers_for``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from simtrain.lower.lowering import lower_program
from simtrain.lower.ops import ComputeOp, Op
from simtrain.plan.load import load_config
from simtrain.spec.config import RunConfig
from simtrain.studies.simulate import simulate

BASE: dict[str, Any] = {
    "name": "param-gather", "model": {"preset": "llama3-8b", "n_layers": 8},
    "hardware": {"node": "dgx-h100", "n_nodes": 2},
    "layout": {"tp": 1, "dp": 16, "zero_stage": 1, "overlap_param_gather": True, "grad_bucket_MiB": 64},
    "train": {"seq_len": 2048, "global_batch_seqs": 32},
}


def _run(**layout: Any) -> RunConfig:
    cfg = {**BASE, "layout": {**BASE["layout"], **layout}}
    return load_config(cfg)


def _gathers(ops: list[Op]) -> list[Op]:
    return [op for op in ops if op.name == "dp.param_all_gather"]


def _first_forward_deps(ops: list[Op]) -> list[tuple[Op, set[int]]]:
    """Micro-batch 0's forward compute ops, in order, each with the parameter gathers it waits for."""
    gathers = {op.idx for op in _gathers(ops)}
    return [(op, set(op.deps) & gathers) for op in ops
            if isinstance(op, ComputeOp) and op.microbatch == 0 and op.category == "fwd"]


def test_buckets_carry_every_parameter_once() -> None:
    """The gathers' bytes are the stage's bf16 parameters, in buckets of at most ``grad_bucket_MiB``."""
    run = _run()
    prog = lower_program(run).programs[0]
    sizes = [op.comm_bytes for op in _gathers(prog.ops)]
    params = run.model.param_count()
    assert sum(sizes) == pytest.approx(2.0 * params, rel=1e-9)
    assert max(sizes) <= 64 * 2**20 + 1e-6
    assert len(sizes) > 10


def test_each_unit_waits_for_its_own_buckets_only() -> None:
    """The embedding's forward waits for the first bucket(s), not the last; every bucket is waited for exactly
    once in micro-batch 0's forward, in issue order (forward order)."""
    prog = lower_program(_run()).programs[0]
    issued = [op.idx for op in _gathers(prog.ops)]
    waits = [deps for _, deps in _first_forward_deps(prog.ops) if deps]
    assert issued[-1] not in waits[0] and issued[0] in waits[0]
    flat = [i for w in waits for i in sorted(w)]
    assert flat == issued  # each once, and a later unit never waits for an earlier-issued bucket
    assert len(waits) > 2  # spread over the forward, not all before the first kernel


def test_forward_starts_after_the_first_bucket_not_all() -> None:
    """In the simulated step the first compute kernel starts once the first bucket has arrived, while the
    later buckets are still being gathered beside the forward."""
    run = _run()
    run = run.model_copy(update={"sim": run.sim.model_copy(update={"steady_state": False})})
    res = simulate(run, trace=True)
    rank = min(e.rank for e in res.trace)
    events = [e for e in res.trace if e.rank == rank]
    gathers = sorted((e for e in events if e.name == "dp.param_all_gather"), key=lambda e: e.start_s)
    first_compute = min(e.start_s for e in events if e.stream == "compute")
    assert first_compute < gathers[-1].end_s
    assert first_compute <= gathers[len(gathers) // 2].end_s


def test_blocking_gather_unchanged_without_overlap() -> None:
    """Without --overlap-param-gather the gathers follow the optimizer, none at the step's start."""
    prog = lower_program(_run(overlap_param_gather=False)).programs[0]
    opt = next(op.idx for op in prog.ops if op.category == "optimizer")
    assert all(op.idx > opt for op in _gathers(prog.ops))
    assert all(not deps for _, deps in _first_forward_deps(prog.ops))


def test_megatron_bucket_rule() -> None:
    """Megatron-core DDP (the megatron-* stacks) without a layout bucket: max(40M, 1M x dp) parameters on the
    first stage's first chunk, one bucket on any other; the layout's ``grad_bucket_MiB`` wins; other stacks
    keep ``DEFAULT_BUCKET_MiB``."""
    from simtrain.lower.stack_rules import dp_bucket_bytes
    from simtrain.spec.config import DEFAULT_BUCKET_MiB

    def layout(**kw: Any) -> Any:
        return _run(grad_bucket_MiB=None, **kw).layout

    mega = _run(grad_bucket_MiB=None).train.stack_spec
    assert mega.megatron_buckets
    assert dp_bucket_bytes(layout(), mega, 2.0, 0, 0) == 40e6 * 2.0  # dp 16: the 40M floor
    wide = layout().model_copy(update={"dp": 128})
    assert wide.data_degree == 128
    assert dp_bucket_bytes(wide, mega, 4.0, 0, 0) == 128e6 * 4.0  # 1M per data-parallel rank
    assert dp_bucket_bytes(layout(), mega, 2.0, 1, 0) == float("inf")
    assert dp_bucket_bytes(layout(), mega, 2.0, 0, 1) == float("inf")
    assert dp_bucket_bytes(_run().layout, mega, 2.0, 1, 1) == 64 * 2**20
    other = load_config({**BASE, "layout": {**BASE["layout"], "grad_bucket_MiB": None},
                         "train": {**BASE["train"], "stack": "deepspeed"}}).train.stack_spec
    assert not other.megatron_buckets
    assert dp_bucket_bytes(layout(), other, 2.0, 1, 0) == DEFAULT_BUCKET_MiB * 2**20


def test_later_stages_reduce_and_gather_one_bucket() -> None:
    """Under PP on a Megatron stack, a stage after the first reduce-scatters its gradients and all-gathers its
    parameters as one bucket each (the whole stage), and its first forward waits for that one gather; the
    first stage keeps several buckets."""
    run = _run(grad_bucket_MiB=None, pp=2, dp=8)
    first, second = lower_program(run).programs
    assert len(_gathers(second.ops)) == 1
    assert len([op for op in second.ops if op.name == "dp.reduce_scatter"]) == 1
    waits = [deps for _, deps in _first_forward_deps(second.ops) if deps]
    assert len(waits) == 1
    assert len(_gathers(first.ops)) > 1


def test_torch_ddp_closes_its_first_bucket_at_1_mib() -> None:
    """PyTorch DDP (the pytorch-eager stack, ``dp.first_bucket_MiB`` 1) closes a step's first gradient bucket at
    1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``): with 25 MiB buckets, an 8-layer Llama (hidden 256, 4K vocabulary,
    fp32 gradients) reduces its LM head and final norm alone (4,195,328 bytes: 4096 x 256 + 256 parameters),
    early in the backward, then the layers and the embedding (27,803,648 bytes), as the real DDP step's buckets
    read in ``benchmarks/ddp_buckets.py``. Without the first bucket the head waits for the layers (27,804,672
    bytes: the head and seven layers, which pass 25 MiB with the eighth), and the embedding goes alone; ZeRO-1
    keeps equal buckets (the rule is DDP's)."""
    cfg = yaml.safe_load((Path(__file__).parent / "calibration" / "data" / "grid" / "l8-s128-v4k.yaml").read_text())
    cfg["layout"]["dp"], cfg["train"]["global_batch_seqs"] = 8, 32

    def sizes(stack: Any, **layout: Any) -> list[float]:
        run = load_config({**cfg, "layout": {**cfg["layout"], **layout}, "train": {**cfg["train"], "stack": stack}})
        return [op.comm_bytes for op in lower_program(run).programs[0].ops
                if op.name in ("dp.all_reduce", "dp.reduce_scatter")]

    head = 4096 * 256 + 256
    total = load_config(cfg).model.param_count()
    assert sizes("pytorch-eager") == [4.0 * head, 4.0 * (total - head)]
    assert sizes({"preset": "pytorch-eager", "dp": {"first_bucket_MiB": None}}) == [27804672.0, 4.0 * 4096 * 256]
    assert sizes("pytorch-eager", zero_stage=1) == [27804672.0, 4.0 * 4096 * 256]
