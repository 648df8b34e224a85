"""One transformer layer as kernels, walked from its description: for each component of
``ModelSpec.layer(i)`` (``simtrain.spec.layer_desc.LayerDesc``) its kernels, between the norm before it and the
residual add after it, with the tensor-parallel collectives around it.

Segments alternate the way Megatron-LM's tensor parallelism does (Shoeybi et al. 2019, Fig. 3: one
all-reduce after the attention and one after the MLP in forward, mirrored in backward; with sequence
parallelism (Korthikanti et al. 2022, sec. 4.2.2) each all-reduce becomes a reduce-scatter, and an all-gather
precedes each column-parallel GEMM). An MoE block keeps its tokens sequence-sharded and moves them itself
(Megatron-core).

Which kernels a component becomes is looked up by its type (``KERNELS``, ``register_kernels``): attention,
dense MLP and MoE have their builders; any other component gets ``GenericKernels``' from its linears, so a
new block type described once in ``simtrain.spec.layer_desc`` is lowered, costed and simulated as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simtrain.lower.blocks.attention import AttentionKernels
from simtrain.lower.blocks.generic import GenericKernels
from simtrain.lower.blocks.mlp import MLP_COLUMN_START, MLPKernels
from simtrain.lower.blocks.moe import MoEKernels
from simtrain.lower.blocks.segments import Comm, Segment, merge
from simtrain.lower.kernels import KernelDesc
from simtrain.spec.collective_kinds import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER
from simtrain.spec.layer_desc import MLP, Attention, Component, MoE, Norm


@dataclass(frozen=True, slots=True)
class ComponentKernels:
    """How one type of layer component becomes kernels on a rank (its builder's methods)."""

    forward: Callable[[LayerKernels, Any, int | None], list[Segment]]
    """Forward segments of the component (the builder, the component, the layer index or None)."""
    backward: Callable[[LayerKernels, Any, int | None], list[Segment]]
    """Backward segments; under TP (not sharded) the last one is a kernel tuple ending with the backward of
    the linears that read the layer input."""
    column_start: Callable[[LayerKernels, Any], int] | None
    """Where those linears' backward starts in that last tuple (Megatron runs their dgrads, then their wgrads
    beside the input gradient's reduction: ``LayerKernels._column_backward``). None: the component keeps its
    tokens sequence-sharded and runs its own collectives (MoE)."""
    amax: str = ""
    """Its place in ``BlockShape.amax_casts`` (``attn``, ``mlp``: keys ``attn_fwd`` ...); "" none."""


KERNELS: dict[type[Component], ComponentKernels] = {
    Attention: ComponentKernels(lambda k, c, layer: k.attention_forward(c, layer),
                                lambda k, c, layer: k.attention_backward(c, layer),
                                lambda k, c: len(k._rope(c, True)), "attn"),
    MLP: ComponentKernels(lambda k, c, layer: k.mlp_forward(c), lambda k, c, layer: k.mlp_backward(c),
                          lambda k, c: MLP_COLUMN_START, "mlp"),
    MoE: ComponentKernels(lambda k, c, layer: k.moe_forward(c), lambda k, c, layer: k.moe_backward(c), None, "mlp"),
    Component: ComponentKernels(lambda k, c, layer: k.component_forward(c),
                                lambda k, c, layer: k.component_backward(c),
                                lambda k, c: k.component_column_start(c)),
}
"""Kernel builders by component type; a subclass uses its nearest registered base (``Component``: the
generic kernels from its linears)."""


def register_kernels(cls: type[Component], kernels: ComponentKernels) -> None:
    """Give a component type its own kernels (a component that the generic ones do not fit)."""
    KERNELS[cls] = kernels


def kernels_of(c: Component) -> ComponentKernels:
    """The kernel builder of a component: its type's, or its nearest registered base's."""
    return next(KERNELS[cls] for cls in type(c).__mro__ if cls in KERNELS)


class LayerKernels(AttentionKernels, MLPKernels, MoEKernels, GenericKernels):
    """A transformer layer's segments from its description (a mixin of ``BlockBuilder``)."""

    __slots__ = ()

    def _sublayers(self, layer: int | None) -> list[tuple[Norm | None, Component]]:
        """The layer's components that are not norms, each with the norm just before it (pre-norm), if any."""
        out: list[tuple[Norm | None, Component]] = []
        norm: Norm | None = None
        for c in self.model.layer(layer).components:
            if isinstance(c, Norm):
                norm = c
            else:
                out.append((norm, c))
                norm = None
        return out

    def _layer_forward(self, layer: int | None = None) -> list[Segment]:
        """Forward segments of transformer layer ``layer`` (None: the model's common dense layer): per
        component, its norm, its kernels between the TP collectives, its residual add."""
        size = 2.0 * self.T * self.model.hidden
        segs: list[Segment | tuple[KernelDesc | None, ...]] = []
        for i, (norm, c) in enumerate(self._sublayers(layer), 1):
            kern = kernels_of(c)
            body = kern.forward(self, c, layer)
            ln = (self._norm(f"ln{i}", False),) if norm is not None else ()
            res = (self._residual(f"residual{i}", False),)
            if self.t == 1 or (self.sp and kern.column_start is None):
                segs += [ln, *body, res]  # an MoE block's tokens stay sequence-sharded; dispatch moves them
            elif not self.sp:
                segs += [ln, *body, Comm(ALL_REDUCE, size), res]
            else:
                amax = self._amax(f"{kern.amax}_fwd") if kern.amax else []
                segs += [ln, *amax, Comm(ALL_GATHER, self._gather_bytes(size)), *body, Comm(REDUCE_SCATTER, size),
                         res]
        return merge(segs)

    def _layer_backward(self, layer: int | None = None) -> list[Segment]:
        """Backward segments of transformer layer ``layer`` (reverse order of the forward)."""
        size = 2.0 * self.T * self.model.hidden
        megatron_linears = not self.dtensor_tp if self.sp else self.tp_async_grad_allreduce
        segs: list[Segment | tuple[KernelDesc | None, ...]] = []
        for i, (norm, c) in reversed(list(enumerate(self._sublayers(layer), 1))):
            kern = kernels_of(c)
            body, start = kern.backward(self, c, layer), kern.column_start
            res = (self._residual(f"residual{i}.bwd", True),)
            ln = (self._norm(f"ln{i}.bwd", True),) if norm is not None else ()
            amax = self._amax(f"{kern.amax}_bwd") if kern.amax else []
            if self.t == 1:
                segs += [res, *body, ln]
            elif megatron_linears and start is not None:  # asynchronous input-gradient reductions
                last = body[-1]
                assert isinstance(last, tuple)
                columns = self._column_backward(last, start(self, c))
                # SP: the output gradient of each row-parallel layer is all-gathered, after the all-reduce of
                # its FP8 amax where current scaling runs one
                out_grad: list[Segment] = [Comm(ALL_GATHER, size)] if self.sp else []
                segs += [res, *amax, *out_grad, *body[:-1], *columns, ln]
            elif megatron_linears:  # no SP: an MoE block's input gradient is all-reduced after it
                segs += [res, *body, *([] if self.sp else [Comm(ALL_REDUCE, size)]), ln]
            elif not self.sp:
                segs += [res, *body, Comm(ALL_REDUCE, size), ln]
            elif start is None:
                segs += [res, *body, ln]
            else:  # the reduce-scatter of dX, a sum of separate projections' outputs
                segs += [res, *amax, Comm(ALL_GATHER, size), *body, Comm(REDUCE_SCATTER, size, fusable=False), ln]
        return merge(segs)

    def _column_backward(self, kernels: tuple[KernelDesc, ...], first_column: int) -> list[Segment]:
        """Megatron's backward of column-parallel GEMMs (``kernels[first_column:]``, their dgrad and wgrad
        GEMMs, after ``kernels[:first_column]``): the dgrads, then the wgrads beside the asynchronous
        reduction of the input gradient the dgrads produced; with sequence parallelism the input, saved
        as its shard, is all-gathered again beside the dgrads and the wgrads wait for it.

        Megatron's ``LinearWithGradAccumulationAndAsyncCommunication.backward``: with sequence
        parallelism it all-gathers the saved input shard asynchronously while the dgrad GEMM runs, then
        reduce-scatters the input gradient asynchronously while the wgrad GEMM runs (Korthikanti et al.
        2022, sec. 4.2.2); without, it all-reduces the input gradient asynchronously beside the wgrad GEMM
        (``async_grad_allreduce``, on by default since Megatron-LM v2.6). Transformer Engine's userbuffers
        run the first two as "bulk" overlaps (``initialize_ub`` defaults: ``qkv_dgrad`` / ``fc1_dgrad``
        all-gather beside dgrad, ``qkv_wgrad`` / ``fc1_wgrad`` reduce-scatter beside wgrad); its linears
        all-reduce asynchronously without SP. None of them is split into GEMM chunks.
        """
        size = 2.0 * self.T * self.model.hidden
        column = kernels[first_column:]
        wgrads = tuple(k for k in column if k.name.endswith(".wgrad"))
        dgrads = tuple(k for k in column if not k.name.endswith(".wgrad"))
        if not self.sp:
            return [(*kernels[:first_column], *dgrads), Comm(ALL_REDUCE, size, fusable=False).overlapped(),
                    wgrads]
        return [kernels[:first_column], Comm(ALL_GATHER, size, fusable=False).overlapped(), dgrads,
                Comm(REDUCE_SCATTER, size, fusable=False).overlapped(), wgrads]
