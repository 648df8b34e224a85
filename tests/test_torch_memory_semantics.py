"""Memory that PyTorch's own machinery holds, against Megatron / DeepSpeed: closed-form cases.

- FSDP (``SoftwareStack.torch_fsdp``): the fp32 shard is the optimizer's master weight (no bf16 shard
  beside it) and the root unit's parameters (embedding, final norm, LM head) stay gathered.
- FP8 weight copies live for the step only where Transformer Engine caches them.
- Op-level SAC under ``torch.compile`` keeps only what the backward reads.
"""

from __future__ import annotations

import pytest

from simtrain.lower.memory import (
    activation_shape,
    fp8_weight_cache_bytes,
    op_sac_activation_bytes,
    static_memory,
)
from simtrain.spec.config import LayoutConfig, TrainConfig
from simtrain.spec.model import ModelSpec
from simtrain.studies.simulate import simulate

PSI, LAYER, ROOT, SHARD = 8.0e9, 2.0e8, 1.0e9, 8
LLAMA = dict(name="ltiny", n_layers=4, hidden=512, n_heads=8, n_kv_heads=2, ffn_hidden=1408, activation="swiglu",
             norm="rmsnorm", position="rope", vocab=32000, max_position=8192, tied_embeddings=False, linear_bias=False)


def _static(stack: str, precision: str = "bf16") -> dict[str, float]:
    lay = LayoutConfig(dp=SHARD, fsdp="full")
    train = TrainConfig(global_batch_seqs=SHARD, stack=stack, precision=precision)
    return static_memory(PSI, LAYER, 32, lay, train, SHARD, 0.0, root_params=ROOT)


@pytest.mark.parametrize("stack", ["torchtitan-compile", "composer-fsdp", "pytorch-eager"])
def test_torch_fsdp_keeps_fp32_master_shards_and_the_root_gathered(stack: str) -> None:
    mem = _static(stack)
    assert mem["weights"] == 0.0  # the fp32 shard is the master: fp32 4 + m 4 + v 4, no bf16 shard
    assert mem["optimizer"] == pytest.approx(12.0 * PSI / SHARD)
    assert mem["grads"] == pytest.approx(4.0 * PSI / SHARD)
    layers = 2 * 2.0 * LAYER + 4.0 * LAYER  # gathered layer + prefetched layer, one unsharded fp32 grad
    assert mem["comm_buffers"] == pytest.approx(layers + 2.0 * ROOT)  # + the root's bf16 parameters
    # one rank: the same fp32 parameters, nothing sharded
    lay, train = LayoutConfig(dp=1, fsdp="full"), TrainConfig(global_batch_seqs=1, stack=stack)
    assert static_memory(PSI, LAYER, 32, lay, train, 1, 0.0, root_params=ROOT)["weights"] == 0.0


def test_deepspeed_zero3_keeps_a_bf16_partition_beside_its_fp32_master() -> None:
    mem = _static("deepspeed")
    assert mem["weights"] == pytest.approx(2.0 * PSI / SHARD)
    assert mem["comm_buffers"] == pytest.approx(2 * 2.0 * LAYER + 4.0 * LAYER)  # no root kept gathered
    torch_total = sum(_static("torchtitan-compile").values())
    assert sum(mem.values()) - torch_total == pytest.approx(2.0 * PSI / SHARD - 2.0 * ROOT)


@pytest.mark.parametrize(("stack", "precision", "expected"), [
    ("megatron-te", "fp8", 2.0 * LAYER * 32 / SHARD),  # TE caches the FP8 weight and its transpose
    ("torchtitan-compile", "fp8", 0.0),  # torchao re-quantises at every use
    ("megatron-te", "bf16", 0.0),
])
def test_fp8_weight_copies_live_only_where_they_are_cached(stack: str, precision: str, expected: float) -> None:
    lay = LayoutConfig(dp=SHARD, fsdp="full")
    train = TrainConfig(global_batch_seqs=SHARD, stack=stack, precision=precision)
    assert fp8_weight_cache_bytes(LAYER * 32, lay, train, SHARD) == pytest.approx(expected)


@pytest.mark.parametrize("tp", [1, 2])
def test_compiled_op_sac_drops_the_row_parallel_outputs(tp: int) -> None:
    spec = ModelSpec(**LLAMA)  # type: ignore[arg-type]
    shape = activation_shape(TrainConfig(global_batch_seqs=2, micro_batch_size=2, seq_len=1024),
                             LayoutConfig(tp=tp, dp=1, sequence_parallel=tp > 1), spec)
    th = shape.tokens * spec.hidden
    eager, compiled = op_sac_activation_bytes(spec, shape), op_sac_activation_bytes(spec, shape, compiled=True)
    # w2 (the 7th matmul, a saved parity) keeps its full-width partial sum; with SP each reduce-scatter
    # output (after wo and w2) is saved too; the compiled graph keeps none of them
    rs = 2 * 2.0 * th / tp if tp > 1 else 0.0
    assert eager - compiled == pytest.approx(2.0 * th + rs)


def test_a_compiled_torchtitan_block_peaks_lower_than_an_eager_one() -> None:
    def peak(stack: str) -> float:
        res = simulate(dict(model=LLAMA, hardware=dict(n_nodes=1),
                            layout=dict(dp=8, fsdp="full", recompute="op_sac"),
                            train=dict(global_batch_seqs=16, micro_batch_size=2, seq_len=1024, stack=stack)))
        return res.memory[0].peak_bytes

    eager, compiled = peak("torchtitan-eager"), peak("torchtitan-compile-2024")
    # at the loss every layer holds its SAC activations: the compiled ones lack w2's output (2 x tokens x h)
    layer_w2 = 2.0 * 2 * 1024 * 512
    assert eager - compiled == pytest.approx(LLAMA["n_layers"] * layer_w2 * 1.05, rel=0.01)  # + 5 % fragmentation
