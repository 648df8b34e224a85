"""Which breakdown axis an op's time counts under, and how much a communication in flight slows the
compute beside it: the engine's and the critical-path evaluator's shared rules."""

from __future__ import annotations

from collections.abc import Reversible

from simtrain.engine.comm_planner import P2P_CLASS
from simtrain.hardware.hardware import GpuSpec
from simtrain.lower.ops import Op

#: The axes ``StepResult.breakdown_s`` lists, besides ``other``.
AXES = ("tp", "cp", "ep", "dp", "pp")

#: Breakdown axis of the group axes that are not their own (``StepResult.breakdown_s`` lists AXES):
#: the expert-data-parallel gradient reduction is data parallelism, expert TP is tensor parallelism.
_BREAKDOWN_AXIS = {"edp": "dp", "etp": "tp"}


def _axis(op: Op) -> str:
    """The breakdown axis an op's time counts under (``pp_emb`` -> ``pp``, ``dp_cp`` -> ``dp``, ``edp``
    -> ``dp``, ``etp`` -> ``tp``; no axis -> ``other``)."""
    axis: str = getattr(op, "axis", "")  # compute ops have none (hot path: no isinstance chain)
    if not axis:
        return "other"
    axis = axis.split("_")[0]
    return _BREAKDOWN_AXIS.get(axis, axis)


_AXES: dict[str, str] = {}
"""``_axis`` by an op's own axis name (pure: a process-wide memo)."""


def _axis_of(op: Op) -> str:
    """``_axis(op)``, memoised (the hot path: once or twice per executed op)."""
    name: str = getattr(op, "axis", "")
    axis = _AXES.get(name)
    if axis is None:
        axis = _AXES[name] = _axis(op)
    return axis


def _interference(gpu: GpuSpec, cls: str) -> float:
    """Fractional slowdown of compute while a communication of class ``cls`` is in flight on the GPU.
    A collective's NCCL kernel holds one SM per channel for its whole duration and never shares it
    with compute (sjeaugey, NVIDIA/nccl#689): the profile's ``comm_interference_*`` per link class.
    A pipeline send/recv runs one small CTA per peer (NVIDIA/nccl#1433: grid <<<1,1,1>>>): by
    default one SM's share [derived]."""
    if cls == P2P_CLASS:
        return 1.0 / gpu.sm_count if gpu.comm_interference_p2p is None else gpu.comm_interference_p2p
    return gpu.comm_interference_net if cls == "net" else gpu.comm_interference_nvlink


def charge_stream(recent: Reversible[tuple[float, float, str]], exposed: dict[str, float], ready: float,
                  start: float, axis: str) -> None:
    """Charge the compute stream's wait from ``ready`` to ``start`` (seconds) for an op of a comm stream,
    whose last ops ran as ``recent`` ((start, end, axis), oldest first), to ``exposed`` under the axes of
    the ops that stream ran meanwhile: an optimizer waiting for the embedding all-reduce queued behind the
    data-parallel gradient reduction waited for both, each for its own time. The stream's idle time before
    an op (it waited for the op's inputs) goes to that op; anything left to ``axis``, the awaited op's."""
    window = []
    for entry in reversed(recent):
        if entry[1] <= ready:
            break
        window.append(entry)
    at = ready  # charged forward in time, each instant once
    for _, e, ax in reversed(window):
        end = min(e, start)
        if end > at:  # the op's run, and the stream's wait for it before it started
            exposed[ax] += end - at
            at = end
    if start > at:
        exposed[axis] += start - at
