"""A layer's kernels come from its description (issue 27 part 5): ``simtrain.lower.blocks`` walks
``ModelSpec.layer(i)`` component by component, so a new block type declared once (its linears, FLOPs and
saved bytes, ``simtrain.spec.layer_desc``) is lowered, costed and simulated with no other edit."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from simtrain.lower.blocks import KERNELS, BlockBuilder, Comm, ComponentKernels, kernels_of
from simtrain.lower.flops import model_flops_per_token
from simtrain.lower.kernels import Gemm, KernelDesc, MemoryBound
from simtrain.lower.lowering import lower_program
from simtrain.lower.ops import ComputeOp
from simtrain.plan.load import load_config
from simtrain.spec.collective_kinds import CollectiveKind
from simtrain.spec.config import RunConfig
from simtrain.spec.layer_desc import (
    MLP,
    ActivationShape,
    Attention,
    Component,
    LatentAttention,
    LayerDesc,
    Linear,
    MoE,
    SavedBytes,
    SavePolicy,
    TPStyle,
)
from simtrain.spec.model import ModelSpec, preset
from simtrain.studies.simulate import simulate


@dataclasses.dataclass(frozen=True, slots=True)
class GatedScan(Component):
    """A gated SSM-like mixer (Mamba-style in/out projections around a scan): declared only here."""

    hidden: int
    state: int

    def linears(self) -> tuple[Linear, ...]:
        return (Linear("in_proj", self.hidden, 2 * self.state, TPStyle.COL),
                Linear("out_proj", self.state, self.hidden, TPStyle.ROW))  # fmt: skip

    def params(self) -> int:
        return sum(lin.params for lin in self.linears()) + self.state  # + a decay per channel

    def seq_flops_per_token(self, seq_len: int) -> float:
        return 6.0 * self.state

    def saved(self, a: ActivationShape, policy: SavePolicy) -> SavedBytes:
        return SavedBytes(linear_inputs=2.0 * a.tokens * self.hidden, sharded=6.0 * a.tokens * self.state)


class HybridSpec(ModelSpec):
    """Every block of the base model gets a norm + GatedScan after its MLP; only ``layer`` changes."""

    def layer(self, i: int | None = None) -> LayerDesc:
        base = super().layer(i)
        return LayerDesc((*base.components, self.norm_component(), GatedScan(self.hidden, 2 * self.hidden)))


def _hybrid(model: ModelSpec) -> HybridSpec:
    return HybridSpec(**model.model_dump())


def _kernels(segs: list) -> list[KernelDesc]:
    return [k for s in segs if isinstance(s, tuple) for k in s]


def _comms(segs: list) -> list[Comm]:
    return [s for s in segs if isinstance(s, Comm)]


def test_components_find_their_kernels_by_type() -> None:
    """Attention (and its MLA subclass), MLP and MoE have their builders; any other component the generic one."""
    assert kernels_of(preset("deepseek-v3").layer(0).attention) is KERNELS[Attention]
    assert isinstance(preset("deepseek-v3").layer(0).attention, LatentAttention)
    assert kernels_of(preset("llama3-8b").layer(0).ffn) is KERNELS[MLP]
    assert kernels_of(preset("mixtral-8x7b").layer(0).ffn) is KERNELS[MoE]
    assert kernels_of(GatedScan(8, 16)) is KERNELS[Component]
    assert all(isinstance(k, ComponentKernels) for k in KERNELS.values())


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (4, True)])
def test_a_new_component_gets_its_kernels_from_its_description(t: int, sp: bool) -> None:
    """The mixer's GEMMs are its linears per TP rank (column-parallel in_proj: N / t, row-parallel out_proj:
    K / t), between them one memory-bound kernel reading in_proj's output and writing out_proj's input;
    backward: dgrad and wgrad per GEMM, the core twice. Everything else of the layer is unchanged."""
    base = preset("llama3-8b")
    hybrid = _hybrid(base)
    b, s = 1, 2048
    T, h, state = b * s, base.hidden, 2 * base.hidden
    new, old = BlockBuilder(hybrid, b, s, t, sp, True, False), BlockBuilder(base, b, s, t, sp, True, False)
    core = 2.0 * T * (2 * state // t + state // t)
    fwd = [k for k in _kernels(new.layer_forward(0)) if k not in _kernels(old.layer_forward(0))]
    assert fwd == [MemoryBound("ln3", 2 * 2.0 * (T // t if sp else T) * h), Gemm("in_proj", T, 2 * state // t, h),
                   MemoryBound("gatedscan.core", core), Gemm("out_proj", T, h, state // t),
                   MemoryBound("residual3", 3 * 2.0 * (T // t if sp else T) * h)]
    bwd = [k for k in _kernels(new.layer_backward(0)) if k not in _kernels(old.layer_backward(0))]
    assert sorted(bwd, key=lambda k: k.name) == sorted([
        Gemm("out_proj.dgrad", T, state // t, h), Gemm("out_proj.wgrad", state // t, h, T),
        MemoryBound("gatedscan.core.bwd", 2 * core), Gemm("in_proj.dgrad", T, h, 2 * state // t),
        Gemm("in_proj.wgrad", h, 2 * state // t, T), MemoryBound("ln3.bwd", 3 * 2.0 * (T // t if sp else T) * h),
    ], key=lambda k: k.name)
    # backward = 2 x forward GEMM FLOPs (Narayanan et al. 2021)
    gemm_flops = sum(k.flops for k in fwd if isinstance(k, Gemm))
    assert gemm_flops == 2.0 * T * (2 * state // t * h + h * state // t)
    assert sum(k.flops for k in bwd if isinstance(k, Gemm)) == 2 * gemm_flops
    # its TP collectives are a dense sublayer's: none on one rank, an all-reduce each way without SP, and
    # with SP an all-gather before it and a reduce-scatter after it in forward
    extra = [c.coll.kind for c in _comms(new.layer_forward(0))]
    for c in _comms(old.layer_forward(0)):
        extra.remove(c.coll.kind)
    assert extra == ([] if t == 1 else [CollectiveKind.ALL_REDUCE] if not sp
                     else [CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER])


TINY = {"model": {"preset": "llama3-8b", "n_layers": 4}, "hardware": {"node": "dgx-h100", "n_nodes": 1},
        "layout": {"tp": 2, "dp": 4, "sequence_parallel": True}, "train": {"seq_len": 2048, "global_batch_seqs": 8}}


def _runs() -> tuple[RunConfig, RunConfig]:
    base = load_config(copy.deepcopy(TINY))
    return base, load_config(base.model_copy(update={"model": _hybrid(base.model)}))


def test_a_new_block_type_runs_through_simulate() -> None:
    """Lowered, costed and simulated from the description alone: the program gains exactly the mixer's GEMM
    FLOPs (3 x 2 x T x its weights per rank, every layer and micro-batch), the model FLOPs gain its 3 x (2 x
    weights + scan) per token, and the step takes longer."""
    base, hybrid = _runs()
    h, state, t = base.model.hidden, 2 * base.model.hidden, base.layout.tp
    T = base.train.micro_batch_size * base.train.seq_len

    def program_flops(run: RunConfig) -> float:
        (program,) = lower_program(run).programs
        return sum(op.flops for op in program.ops if isinstance(op, ComputeOp))

    r0, r1 = simulate(base), simulate(hybrid)
    per_layer = 3 * 2.0 * T * (2 * state // t * h + h * state // t)
    assert program_flops(hybrid) - program_flops(base) == pytest.approx(
        base.model.n_layers * r0.microbatches * per_layer, rel=1e-12)
    gained = model_flops_per_token(hybrid.model, 2048) - model_flops_per_token(base.model, 2048)
    assert gained == pytest.approx(3 * base.model.n_layers * (2 * (2 * h * state + state * h) + 6.0 * state),
                                   rel=1e-12)
    tokens = r1.global_batch_tokens
    assert r1.model_tflops_per_gpu * 1e12 * r1.step_time_s * r1.n_gpus == pytest.approx(
        model_flops_per_token(hybrid.model, 2048) * tokens, rel=1e-9)
    assert r1.step_time_s > r0.step_time_s
    assert r1.memory[0].peak_bytes > r0.memory[0].peak_bytes


def test_the_component_mixins_do_not_shadow_each_other() -> None:
    """``BlockBuilder`` is ``BlockShape`` plus one mixin per component kind: a name defined in two of them
    would silently take one's method for the other's."""
    defined: dict[str, list[str]] = {}
    for cls in BlockBuilder.__mro__[:-1]:  # not object
        for name in vars(cls):
            if not name.startswith("__"):
                defined.setdefault(name, []).append(cls.__name__)
    assert {name: owners for name, owners in defined.items() if len(owners) > 1} == {}
