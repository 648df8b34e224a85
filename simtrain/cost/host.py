"""The host side of a training step: the CPU issuing kernels ahead of the GPU, and host synchronisations.

A framework's Python loop issues every kernel from one CPU thread. A kernel can start on the GPU when the
GPU has finished the kernels before it *and* the CPU has issued it; the CPU does not wait for the GPU,
so it runs ahead and the launch queue hides its cost as long as the kernels take longer than their issue.
Over a sequence of kernels with GPU times g_j and CPU issue times c_j, starting with the GPU B seconds
behind the CPU (its queued work, the "backlog"), the GPU finishes the sequence at
max(B + G, max_j (C_j + G_{>=j})) (C_j: CPU time through kernel j, G_{>=j}: GPU time from kernel j on),
so the GPU idles

    stall = max(0, D - B),  D = max_j (C_j - G_{<j})

seconds more than its busy time G (a single-server queue whose arrivals are the CPU's issue times; the
Lindley recursion summed over the sequence). The per-kernel max(g, c) of simtrain before this model is
right only when the CPU never gets ahead; with a backlog the short kernels cost nothing extra, from an
empty queue even a long one waits for its own launch.

A host synchronisation (``.item()``, a device-to-host copy the CPU needs the value of) makes the CPU wait
until the GPU has drained its queue, so the run-ahead is lost: afterwards the GPU idles for the sync's
round trip and for the CPU's issue of the next kernels (backlog -``HOST_SYNC_S``). The step's syncs:

- the step boundary (a program starts with an empty queue);
- Megatron's NaN/Inf check of each micro-batch's loss before its backward (``rerun_state_machine
  .validate_result(result=loss, rejection_func=torch.isnan)`` under ``check_for_nan_in_loss_and_grad``,
  Megatron-LM pretrain_gpt.py ``loss_func``) (``LaunchSpec.loss_check_sync``);
- a synchronous pipeline exchange (``SoftwareStack.synchronous_p2p``: Megatron's ``torch.cuda.synchronize()``
  after each ``batch_isend_irecv``): after a send (``CommOp.sync_after``) and before the compute a receive
  feeds (``ComputeOp.sync_before``), so the CPU issues nothing while the GPU waits for a receive;
- Megatron-core's gradient norm before the optimizer update: ``get_grad_norm_fp32`` reduces the norm over
  the model-parallel group and reads it with ``total_norm.item()`` (megatron/core/optimizer/clip_grads.py),
  which clipping needs on the host (``LaunchSpec.grad_norm_sync``);
- dropless MoE: Megatron's all-to-all token dispatcher copies the tokens-per-expert counts to the host and
  synchronises at ``cuda_sync_point = "before_ep_alltoall"`` when EP > 1 or several local experts (the
  all-to-all's split sizes and the grouped GEMM's ``m_splits`` are host lists), ``"before_finish"``
  otherwise; only a fixed, padded expert capacity has no sync (megatron/core/transformer/moe/
  token_dispatcher.py ``MoEAlltoAllTokenDispatcher.preprocess``) (``LaunchSpec.moe_token_count_sync``).
  simtrain's MoE lowering has no capacity factor (dropless), so the sync follows the forward permutation
  (kernel ``moe.permute``).

A routed-expert grouped GEMM is one launch per local expert where the stack runs it so
(``launch.grouped_gemm_per_expert``: Transformer Engine's ``GroupedLinear``), each issued after the MoE sync.
In FP8 with a recipe other than delayed scaling (MXFP8, per-tensor current scaling, blockwise) each expert's
operand is also quantised by a kernel of its own: ``GroupedLinear`` quantises its input (forward) and its
output gradient (backward) with ``tex.split_quantize``, whose ``multi_tensor_quantize_impl`` has a fused
multi-tensor kernel only for delayed scaling ("Currently only have fused kernel for FP8 delayed scaling")
and otherwise quantises the tensors individually, one ``quantize`` per expert (transformer_engine/pytorch/
csrc/extensions/cast.cpp) [src]. So the forward and data-gradient GEMMs of the routed experts issue two
kernels per local expert (the cast, then the GEMM); the weight-gradient GEMMs reuse both column-wise copies
and issue one. The casts' GPU time is already in the GEMM's (``FP8_CAST_BYTES``); here they add CPU issue.

A collective or pipeline send the CPU issues through ``torch.distributed`` (c10d's ``ProcessGroupNCCL``: the
Python binding, the ``Work`` object, the CUDA events that order the NCCL stream after the compute stream, the
NCCL launch) takes the CPU ``C10D_COLLECTIVE_CPU_S``, during which it issues no kernel: the GPU's backlog
shrinks by that much, and a collective issued right after a host sync (the MoE dispatch's all-to-all) is GPU
idle time in full. The chunks of a collective fused with its GEMM by TP comm overlap are launched with the
GEMM chunks (``CommOp.host_issued`` False) and cost nothing here.

CPU time per kernel: the stack's ``launch.cpu_launch_s`` (eager PyTorch ~5-10 us per op, reference
hardware-collectives-memory.md sec. 3), times ``GRACE_HOST_FACTOR`` on Grace-hosted GPUs. CUDA graphs
(``launch.cuda_graphs``: Megatron ``cuda_graph_impl`` "local"/"transformer_engine", TE
``make_graphed_callables``) replay a captured sequence with one launch (NVIDIA Megatron-Bridge docs,
"CUDA Graphs": "replay them with minimal host overhead"), so the per-kernel issue time is taken as 0;
the syncs stay (a graph cannot capture one; Megatron-Bridge graphs the MoE preprocess separately).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from simtrain.cost.costs import ComputeCostModel
from simtrain.lower.ops import CommOp, CostedComputeOp, Kernel, Op, Stream
from simtrain.spec.stacks import SoftwareStack

#: Round trip of a host synchronisation, seconds: the GPU signals the host, the CPU thread wakes from
#: ``cudaStreamSynchronize`` and reads the value, then issues the next launch (~one kernel launch floor,
#: reference hardware-collectives-memory.md Table D "~2-5 us kernel launch/tail floor") [rule of thumb].
HOST_SYNC_S = 5e-6
#: CPU time of one PyTorch op on a Grace CPU relative to an x86 host: ``torch.nn.Linear`` forward (one
#: cuBLAS GEMM through one module call) took 33.17 us of CPU on GH200 and 37.08 us on GB200 against
#: 13.48 us on an H100 DGX (Xeon Platinum 8480C), BF16, hidden 2048, 8192 tokens (NVIDIA/TransformerEngine
#: issue #2053, "High CPU overhead on Grace systems", 2025): 2.46 and 2.75, mean 2.6 [obs].
GRACE_HOST_FACTOR = 2.6
#: CPU time of one ``torch.distributed`` collective call on the NCCL backend, seconds: c10d ``all_reduce``
#: 89 us, ``reduce_scatter`` 122 us, ``all_gather`` 131 us (with its output's allocation) in torch 2.4
#: (pytorch/pytorch#138773, ByteDance's benchmark of c10d against functional collectives, x86 host) [obs];
#: the cheapest of the three, for every collective and send (all-to-all and send/recv were not timed) [assumed].
C10D_COLLECTIVE_CPU_S = 89e-6
#: GPUs whose host CPU is a Grace (Grace-Blackwell superchips: GB200, GB300) [spec].
GRACE_HOSTED_GPUS = frozenset({"gb200", "gb300"})
#: Kernels after which dropless MoE synchronises with the host (the forward permutation before the
#: dispatch, ``simtrain.lower.blocks.moe``).
MOE_SYNC_KERNELS = frozenset({"moe.permute"})
#: Kernels after which the loss check synchronises (the forward cross-entropy, ``simtrain.lower.blocks.edges``).
LOSS_SYNC_KERNELS = frozenset({"cross_entropy"})


@dataclass(frozen=True, slots=True)
class HostModel:
    """How the host issues a program's kernels: CPU seconds per launch and where it synchronises."""

    cpu_launch_s: float
    """CPU time to issue one kernel, seconds."""
    sync_after: frozenset[str] = frozenset()
    """Kernel names after which the CPU waits for the GPU to drain (host syncs inside a block)."""
    sync_before_optimizer: bool = False
    """The CPU waits for the GPU before the optimizer update (the gradient norm's ``.item()``)."""
    sync_s: float = HOST_SYNC_S
    """Round trip of one host sync, seconds."""
    per_expert_launch: bool = False
    """A routed-expert grouped GEMM (``expert.*`` with a GEMM shape) launches one GEMM per local expert."""
    per_expert_cast: bool = False
    """With ``per_expert_launch``: each forward and data-gradient expert GEMM's operand is quantised by one
    kernel per local expert (FP8, recipe other than delayed scaling; module docstring)."""
    cpu_collective_s: float = 0.0
    """CPU time to issue one collective or send through ``torch.distributed``, seconds."""

    @property
    def active(self) -> bool:
        """True when the host can stall the GPU at all."""
        return (self.cpu_launch_s > 0 or self.cpu_collective_s > 0 or bool(self.sync_after)
                or self.sync_before_optimizer)


#: FP8 recipes whose ``split_quantize`` runs one fused kernel for all experts (Transformer Engine's
#: ``nvte_multi_cast_transpose``, delayed scaling only; cast.cpp ``multi_tensor_quantize_impl``) [src].
FUSED_SPLIT_QUANTIZE_RECIPES = frozenset({"delayed"})


def host_model(stack: SoftwareStack | None, gpu_name: str = "", fp8_recipe: str | None = None) -> HostModel | None:
    """The host model of ``stack`` on GPU ``gpu_name`` (None: no stack, kernels carry their own times);
    ``fp8_recipe``: the run's FP8 recipe when its GEMMs run in FP8, None when they do not."""
    if stack is None:
        return None
    launch = stack.launch
    cpu = 0.0 if launch.cuda_graphs else launch.cpu_launch_s
    syncs = (MOE_SYNC_KERNELS if launch.moe_token_count_sync else frozenset()) | (
        LOSS_SYNC_KERNELS if launch.loss_check_sync else frozenset())
    per_expert = launch.grouped_gemm_per_expert
    cast = per_expert and fp8_recipe is not None and fp8_recipe not in FUSED_SPLIT_QUANTIZE_RECIPES
    # with CUDA graphs the collectives' issue is taken as 0 like the kernels' (those left outside the graphs,
    # such as the gradient reduction's few per step, are not charged) [assumed]
    coll = 0.0 if launch.cuda_graphs else C10D_COLLECTIVE_CPU_S
    if gpu_name.strip().lower() in GRACE_HOSTED_GPUS:
        cpu *= GRACE_HOST_FACTOR
        coll *= GRACE_HOST_FACTOR
    return HostModel(cpu, syncs, launch.grad_norm_sync, per_expert_launch=per_expert, per_expert_cast=cast,
                     cpu_collective_s=coll)


def host_model_of(source: object) -> HostModel | None:
    """The host model of a cost source: a roofline ``ComputeCostModel``'s stack on its GPU; None for a
    calibrated profile (its kernel times were measured through the host's own issue loop) or another source."""
    if not isinstance(source, ComputeCostModel) or source.calibration is not None:
        return None
    return host_model(source.stack, source.gpu.name, source.fp8_recipe if source.dtype == "fp8" else None)


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of kernels between host syncs: GPU time ``gpu_s``, CPU issue time ``cpu_s``, and ``lead_s``
    = max_j (C_j - G_{<j}), the stall it causes from an empty queue (module docstring)."""

    gpu_s: float
    cpu_s: float
    lead_s: float
    sync_after: bool


def segment(gpu_s: Sequence[float], cpu_s: Sequence[float], sync_after: bool = False,
            launches: Sequence[int] | None = None) -> Segment:
    """The ``Segment`` of kernels with GPU times ``gpu_s`` and CPU issue times ``cpu_s`` (seconds); a kernel
    of n ``launches`` (an unfused op) is n equal kernels of g/n GPU and c/n CPU seconds."""
    g_before = c_before = 0.0
    lead = 0.0
    for i, (g, c) in enumerate(zip(gpu_s, cpu_s, strict=True)):
        n = launches[i] if launches is not None else 1
        # of its n parts, the last leads when each part issues slower than it runs, else the first
        last = n - 1 if c > g else 0
        lead = max(lead, c_before + (last + 1) * c / n - g_before - last * g / n)
        c_before += c
        g_before += g
    return Segment(g_before, c_before, lead, sync_after)


def run_segment(seg: Segment, backlog_s: float, sync_s: float) -> tuple[float, float]:
    """(GPU idle seconds, backlog after) of issuing ``seg`` with the GPU ``backlog_s`` behind the CPU; a
    segment ending in a sync leaves the backlog at ``-sync_s`` (the queue drained, then the round trip)."""
    stall = max(0.0, seg.lead_s - backlog_s)
    after = backlog_s + seg.gpu_s + stall - seg.cpu_s
    return stall, (-sync_s if seg.sync_after else after)


def drained(backlog_s: float, sync_s: float) -> float:
    """The backlog after a host sync issued with the GPU ``backlog_s`` seconds behind the CPU: the CPU waits for
    the queue to drain, then the round trip ``sync_s``. A negative backlog (the GPU already idle, waiting for the
    CPU's issue, e.g. of a collective) is idle time the sync cannot give back, so it stays."""
    return min(backlog_s, 0.0) - sync_s


def launches_of(kernel: Kernel, model: HostModel) -> int:
    """Kernels the CPU issues for ``kernel``: its ``launches``, times the local experts (the GEMM's batch) of a
    routed-expert grouped GEMM that the stack runs as one GEMM per expert, twice that for a forward or
    data-gradient one whose operand is quantised per expert (``HostModel.per_expert_cast``)."""
    if model.per_expert_launch and kernel.shape is not None and kernel.name.startswith("expert."):
        per_expert = 2 if model.per_expert_cast and not kernel.name.endswith(".wgrad") else 1
        return kernel.launches * kernel.shape[3] * per_expert
    return kernel.launches


def segments(kernels: Sequence[Kernel], model: HostModel) -> tuple[Segment, ...]:
    """``kernels`` split after each sync kernel of ``model``."""
    out: list[Segment] = []
    gpu: list[float] = []
    cpu: list[float] = []
    launches: list[int] = []
    for k in kernels:
        n = launches_of(k, model)
        gpu.append(k.time_s)
        cpu.append(n * model.cpu_launch_s)
        launches.append(n)
        if k.name in model.sync_after:
            out.append(segment(gpu, cpu, True, launches))
            gpu, cpu, launches = [], [], []
    if gpu or not out:
        out.append(segment(gpu, cpu, False, launches))
    return tuple(out)


def host_pass(ops: Sequence[Op], model: HostModel, backlog_s: float = 0.0,
              memo: dict[int, tuple[tuple[Kernel, ...], tuple[Segment, ...]]] | None = None) -> tuple[list[Op], float]:
    """``ops`` (one rank's costed program, in issue order) with each compute-stream op's duration grown by
    the GPU idle time the host causes (module docstring), the GPU starting ``backlog_s`` seconds behind the
    CPU; and the backlog after the last op, seconds. ``memo``: segments of kernel tuples already split
    (passes over the same ops share one)."""
    if memo is None:
        memo = {}
    backlog = backlog_s
    out: list[Op] = []
    for op in ops:
        if type(op) is CostedComputeOp and op.stream == Stream.COMPUTE and op.kernels:
            sync = op.sync_before or (model.sync_before_optimizer and op.category == "optimizer")
            # what a wait before the op could hide (RunAhead): before a sync at its start, only the issue the
            # CPU still owed (a negative backlog); else the stall of its kernels up to its first sync
            hideable: float | None = max(-backlog, 0.0) if sync else None
            if sync:
                backlog = drained(backlog, model.sync_s)
            hit = memo.get(id(op.kernels))
            if hit is None or hit[0] is not op.kernels:
                hit = memo[id(op.kernels)] = (op.kernels, segments(op.kernels, model))
            stall = 0.0
            for seg in hit[1]:
                s, backlog = run_segment(seg, backlog, model.sync_s)
                stall += s
                if hideable is None:
                    hideable = s
                sync = sync or seg.sync_after
            if stall > 0.0 or sync:
                op = replace(op, duration_s=op.duration_s + stall, host_stall_s=op.host_stall_s + stall,
                             host_sync=sync, host_hideable_s=op.host_hideable_s + min(hideable or 0.0, stall))
        elif isinstance(op, CommOp):
            if op.host_issued:
                backlog -= model.cpu_collective_s  # the CPU issues no kernel meanwhile
            if op.sync_after:
                backlog = drained(backlog, model.sync_s)
        out.append(op)
    return out, backlog


def add_host_gaps(ops: list[Op], model: HostModel | None) -> list[Op]:
    """``ops`` with the host's GPU idle time (``host_pass``); the queue starts empty (a step boundary)."""
    if model is None or not model.active:
        return ops
    return host_pass(ops, model)[0]


def stall_s(ops: Sequence[Op]) -> float:
    """GPU idle seconds the host causes in ``ops`` (their ``host_stall_s``)."""
    return sum((op.host_stall_s for op in ops if isinstance(op, CostedComputeOp)), 0.0)


def steady_host_gaps(ops: list[Op], model: HostModel | None, cycle: slice) -> tuple[list[Op], float]:
    """``ops`` with the host's GPU idle time where ``ops[cycle]`` is one pass of work a step repeats (a
    micro-batch's actions): the ops before it from an empty queue, those from ``cycle.start`` on from the
    queue the repetition leaves; and how much more the first pass idles from the step's empty queue,
    seconds (paid once per step).

    One pass's map of the backlog is b -> max(b, L) + D (run_segment composed; a collective's CPU time
    shifts it), or a constant after a sync, so a second pass is already in the steady regime: with D >= 0
    the queue stays ahead of every lead, with D < 0 each pass idles -D. One warm-up pass gives it; the
    first-pass excess is that pass's idle time over the steady one's on the same ops."""
    if model is None or not model.active:
        return ops, 0.0
    start = cycle.start or 0
    memo: dict[int, tuple[tuple[Kernel, ...], tuple[Segment, ...]]] = {}
    head, b0 = host_pass(ops[:start], model, 0.0, memo)
    first, b1 = host_pass(ops[cycle], model, b0, memo)
    steady, _ = host_pass(ops[start:], model, b1, memo)
    return head + steady, max(stall_s(first) - stall_s(steady[:len(first)]), 0.0)


@dataclass(slots=True)
class RunAhead:
    """What a static host pass cannot see at a step's start: while the GPU waits for its first compute op's
    inputs (a later pipeline stage's first receive, the ZeRO-1/2 parameter gathers), the CPU keeps issuing,
    so the queue is that much further ahead than the pass, which starts from an empty queue, assumed. One
    per rank, fed the compute stream's ops in order.

    The first compute op's stall s, found by the pass, shrinks by the compute stream's wait w before it, up
    to the part of it a wait can hide, h (``CostedComputeOp.host_hideable_s``): s - min(w, h). The CPU issued
    the op's kernels, and the calls before them, during the wait; but not past a host sync, after which it
    issues from a drained queue again. So h is all of s for an op without a sync, the stall before its first
    sync for one that syncs inside (a MoE layer's token counts), and the issue the CPU still owed for one
    that starts with a sync (a synchronous pipeline receive, ``ComputeOp.sync_before``). Later ops keep the
    stalls the pass found, an upper bound: within the step the run-ahead a wait buys depends on the stack,
    and a step's steady state stays periodic (``simtrain.engine.steady``)."""

    started: bool = False

    def stall(self, op: CostedComputeOp, idle_s: float) -> float:
        """Seconds ``op`` idles for the CPU's issue, the compute stream having idled ``idle_s`` seconds since
        the step's start or its previous compute op (``op.host_stall_s`` at most)."""
        first, self.started = not self.started, True
        s = op.host_stall_s
        return s - min(idle_s, op.host_hideable_s) if first else s
