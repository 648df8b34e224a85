"""Synchronous pipeline exchanges (``SoftwareStack.synchronous_p2p``): Megatron-core's non-interleaved schedule
waits on each batched send/receive on the compute stream (``req.wait()``) and then on the host
(``torch.cuda.synchronize()`` under ``batch_p2p_sync``); Megatron-LM before the switch did so on every schedule."""

from __future__ import annotations

from typing import Any

import pytest

from simtrain.cost.host import C10D_COLLECTIVE_CPU_S, HOST_SYNC_S, HostModel, add_host_gaps, drained
from simtrain.lower.lowering import lower_program
from simtrain.lower.ops import CollectiveOp, ComputeOp, CostedComputeOp, Kernel, SendOp, Stream
from simtrain.lower.stack_rules import synchronous_p2p
from simtrain.plan.load import load_config
from simtrain.spec.collective_kinds import ALL_REDUCE, SEND
from simtrain.spec.stack_spec import P2PSync
from simtrain.spec.stacks import STACKS, get_stack
from simtrain.studies.simulate import simulate

US = 1e-6
C = C10D_COLLECTIVE_CPU_S


def _op(idx: int, time_s: float, launches: int = 1, category: str = "fwd", sync_before: bool = False) -> CostedComputeOp:
    return CostedComputeOp(idx, Stream.COMPUTE, f"op{idx}", category, kernels=(Kernel("k", 0.0, 0.0, time_s,
                           launches=launches),), duration_s=time_s, sync_before=sync_before)


def _send(idx: int, sync: bool) -> SendOp:
    return SendOp(idx, Stream.PP, "pp.send", "comm", coll=SEND, axis="pp", comm_bytes=1e6, peer_stage=1,
                  sync_after=sync)


def _stall(ops: list[Any], model: HostModel, at: int) -> float:
    out = add_host_gaps(list(ops), model)
    return float(out[at].duration_s - ops[at].duration_s)


MODEL = HostModel(8 * US, cpu_collective_s=C)


# -- the host pass: closed forms ----------------------------------------------------------------------

def test_a_sync_keeps_the_idle_time_the_cpu_already_owes() -> None:
    # queued work: the sync drains it and the round trip follows; already idle (negative backlog): kept
    assert drained(3e-3, HOST_SYNC_S) == pytest.approx(-HOST_SYNC_S)
    assert drained(-89 * US, HOST_SYNC_S) == pytest.approx(-94 * US)


def test_a_synchronous_send_loses_the_queue() -> None:
    # 3 ms of queued work hides the send's call (the backlog shrinks by C); synchronised, the next kernel
    # waits for the round trip and its own issue
    queued = [_op(0, 3e-3), _send(1, False), _op(2, 1 * US)]
    assert _stall(queued, MODEL, 2) == 0.0
    synced = [_op(0, 3e-3), _send(1, True), _op(2, 1 * US)]
    assert _stall(synced, MODEL, 2) == pytest.approx(HOST_SYNC_S + 8 * US)
    # from an empty queue: op0 waits 8 us and ends at 9 us; the CPU issues the send (C) from 8 us, then
    # waits for the drained GPU (nothing to give back) and the round trip, then issues op2 (8 us)
    short = [_op(0, 1 * US), _send(1, True), _op(2, 1 * US)]
    assert _stall(short, MODEL, 2) == pytest.approx(8 * US + C + HOST_SYNC_S - 1 * US)
    free = [_op(0, 1 * US), _send(1, False), _op(2, 1 * US)]
    assert _stall(short, MODEL, 2) - _stall(free, MODEL, 2) == pytest.approx(HOST_SYNC_S)


def test_a_synchronous_receive_starts_its_compute_from_a_drained_queue() -> None:
    # queued work does not hide the issue of the compute a synchronous receive feeds
    assert _stall([_op(0, 3e-3), _op(1, 1 * US, sync_before=True)], MODEL, 1) == pytest.approx(HOST_SYNC_S + 8 * US)
    assert _stall([_op(0, 3e-3), _op(1, 1 * US)], MODEL, 1) == 0.0
    # a call the CPU still owed when the GPU ran dry stays idle time (op0 ends at 9 us, the call ends at 98 us),
    # marked as what a wait for the receive's data could hide (the step's first op: RunAhead)
    owed = [_op(0, 1 * US), CollectiveOp(1, Stream.DP, "dp", "comm", coll=ALL_REDUCE, axis="dp", comm_bytes=1e6),
            _op(2, 1 * US, sync_before=True)]
    assert _stall(owed, MODEL, 2) == pytest.approx(C - 1 * US + HOST_SYNC_S + 8 * US)
    out = add_host_gaps(owed, MODEL)
    assert out[2].host_sync and not out[0].host_sync  # type: ignore[attr-defined]
    assert out[2].host_hideable_s == pytest.approx(C - 1 * US)  # type: ignore[attr-defined]


def test_the_optimizer_sync_keeps_a_collective_call_the_gpu_waited_for() -> None:
    # the gradient reduction's call right before the gradient norm's sync: the GPU, drained at 1 us + 8 us,
    # waits for the call, the round trip and the first optimizer launch
    ops = [_op(0, 1 * US), CollectiveOp(1, Stream.DP, "dp", "comm", coll=ALL_REDUCE, axis="dp", comm_bytes=1e6),
           _op(2, 300 * US, launches=4, category="optimizer")]
    model = HostModel(8 * US, sync_before_optimizer=True, cpu_collective_s=C)
    assert _stall(ops, model, 2) == pytest.approx(C - 1 * US + HOST_SYNC_S + 8 * US)


# -- which schedules and stacks ---------------------------------------------------------------------

def test_the_presets_leave_it_off_and_the_rule() -> None:
    # off in every preset (simtrain.spec.stacks: the out-of-sample runs did not improve with it on)
    assert all(stack.synchronous_p2p is P2PSync.NONE for stack in STACKS.values())
    core = load_config(_cfg(ONE_CHUNK)).train.stack_spec
    legacy = load_config(_cfg(EVERY)).train.stack_spec
    assert synchronous_p2p(core, 1) and not synchronous_p2p(core, 2)
    assert synchronous_p2p(legacy, 1) and synchronous_p2p(legacy, 3)
    assert not synchronous_p2p(get_stack("megatron-core"), 1)


def _cfg(stack: Any, pp: int = 2, vpp: int = 1) -> dict[str, Any]:
    model = dict(name="p2p", n_layers=8, hidden=2048, n_heads=16, n_kv_heads=8, ffn_hidden=5632, activation="swiglu",
                 norm="rmsnorm", position="rope", vocab=32000, tied_embeddings=False, linear_bias=False)
    return dict(name="p2p", model=model, hardware=dict(node="dgx-h100", n_nodes=1),
                layout=dict(tp=1, dp=8 // pp, pp=pp, vpp=vpp),
                train=dict(seq_len=2048, global_batch_seqs=32, micro_batch_size=1, stack=stack))


def _programs(cfg: dict[str, Any]) -> list[Any]:
    return lower_program(load_config(cfg)).programs


ONE_CHUNK = {"preset": "megatron-core", "synchronous_p2p": "one_chunk"}
EVERY = {"preset": "megatron-legacy", "synchronous_p2p": "all"}


@pytest.mark.parametrize("stack, vpp, synced", [(ONE_CHUNK, 1, True), (ONE_CHUNK, 2, False), (EVERY, 2, True),
                                                ("megatron-core", 1, False), ("torchtitan-compile", 1, False)])
def test_sends_block_the_compute_stream_and_receives_sync_the_host(stack: Any, vpp: int, synced: bool) -> None:
    for prog in _programs(_cfg(stack, vpp=vpp)):
        sends = [op for op in prog.ops if isinstance(op, SendOp)]
        receiving = [op for op in prog.ops if isinstance(op, ComputeOp) and op.remote is not None]
        assert sends and receiving
        assert all(op.sync_after is synced for op in sends)
        assert all(op.sync_before is synced for op in receiving)
        # every send is waited on by a compute op after it (the next action's, or the optimizer step)
        waited = {d for op in prog.ops if isinstance(op, ComputeOp) for d in op.deps}
        later = [s for s in sends if any(isinstance(o, ComputeOp) and o.idx > s.idx for o in prog.ops)]
        assert all((s.idx in waited) is synced for s in later)
        assert all(not op.sync_before for op in prog.ops if isinstance(op, ComputeOp) and op.remote is None)


def test_a_synchronous_pipeline_is_slower_end_to_end_and_the_interleaved_one_is_not_touched() -> None:
    synced = simulate(_cfg(ONE_CHUNK)).step_time_s
    free = simulate(_cfg("megatron-core")).step_time_s
    # 32 sequences over dp 4: 8 micro-batches, each with at least one synchronised exchange per stage
    assert synced - free >= 8 * HOST_SYNC_S * (1 - 1e-9)
    inter = simulate(_cfg("megatron-core", vpp=2)).step_time_s
    assert simulate(_cfg(ONE_CHUNK, vpp=2)).step_time_s == inter
    assert simulate(_cfg({"preset": "megatron-core", "synchronous_p2p": "all"}, vpp=2)).step_time_s > inter


def test_the_cli_takes_the_field_and_refuses_a_bad_value(tmp_path: Any) -> None:
    import yaml

    from simtrain.cli.main import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_cfg("megatron-core")))
    assert main(["simulate", str(path), "--set", "train.stack.synchronous_p2p=one_chunk"]) == 0
    assert main(["simulate", str(path), "--set", "train.stack.synchronous_p2p=sometimes"]) == 2


@pytest.mark.parametrize("stack", [ONE_CHUNK, EVERY])
@pytest.mark.parametrize("overrides", [["layout.tp=2", "layout.dp=2", "layout.pp=2", "layout.zero_stage=1"],
                                       ["layout.tp=4", "layout.pp=2", "layout.dp=1", "layout.vpp=2"]])
def test_the_search_probe_follows_the_synchronous_program(stack: Any, overrides: list[str]) -> None:
    """The layout search's probe lowers its stages with the same rule, so on one node (no contention for the
    critical path to leave out) it times a synchronous pipeline as the whole program's critical path does, to
    0.5 % (Llama 3 8B's layers, 8 of them, as ``test_probe``'s check without the switch)."""
    from simtrain.engine.critical_path import evaluate_run
    from simtrain.studies.estimate import Estimator
    from simtrain.studies.simulate import cluster_of

    cfg = {"name": "probe", "model": {"preset": "llama3-8b", "n_layers": 8}, "layout": {"tp": 1, "dp": 8},
           "hardware": {"node": "dgx-h100", "n_nodes": 1},
           "train": {"seq_len": 2048, "global_batch_seqs": 32, "stack": stack}}
    run = load_config(cfg, overrides)
    est = Estimator(run.model, cluster_of(run), 0.05).estimate(run.layout, run.train)
    assert est.step_time_s == pytest.approx(evaluate_run(run, steady_state=False).step_time_s, rel=5e-3)
