"""What torchtitan's op-level SAC really keeps per block, eager and under ``torch.compile`` (CPU torch).

A torchtitan-style Llama block (eager RMSNorm with its fp32 upcast, complex RoPE, ``repeat_kv``, SDPA,
SwiGLU; separate wq/wk/wv/wo and w1/w2/w3 linears, torchtitan ``models/llama/model.py``) is wrapped in
``torch.utils.checkpoint`` with torchtitan's op-level policy (``parallelize_llama.py``
``_apply_ac_to_transformer_block``: save mm and SDPA outputs except every second mm, counted per
checkpoint call). The CPU allocator's net bytes over one forward (torch.profiler ``profile_memory``),
less the block's output, are what the block keeps for backward: eager SAC holds every MUST_SAVE output
in its cache; the compiled block saves only what its backward graph reads, so w2's output (read by the
residual add alone) is not kept. Both are compared with ``simtrain.lower.memory.op_sac_activation_bytes``
less the block input (allocated before the forward): within 2 %.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from simtrain.lower.memory import activation_shape, op_sac_activation_bytes  # noqa: E402
from simtrain.spec.config import LayoutConfig, TrainConfig  # noqa: E402
from simtrain.spec.model import ModelSpec  # noqa: E402

H, HEADS, KV_HEADS, FFN, S, B = 256, 8, 2, 704, 128, 2
D = H // HEADS
TOLERANCE = 0.02
SPEC = ModelSpec(name="titan-probe", n_layers=1, hidden=H, n_heads=HEADS, n_kv_heads=KV_HEADS, ffn_hidden=FFN,
                 activation="swiglu", norm="rmsnorm", position="rope", vocab=256, max_position=1024,
                 tied_embeddings=False, linear_bias=False)
nn, F = torch.nn, torch.nn.functional


class _RMSNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(H))

    def forward(self, x: Any) -> Any:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * self.weight


def _rope(x: Any, freqs: Any) -> Any:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.view(1, x.shape[1], 1, -1)).flatten(3).type_as(x)


def _repeat_kv(x: Any, n: int) -> Any:
    b, s, h, d = x.shape
    return x[:, :, :, None, :].expand(b, s, h, n, d).reshape(b, s, h * n, d)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        lin = nn.Linear
        self.wq, self.wk, self.wv = lin(H, H, bias=False), lin(H, KV_HEADS * D, bias=False), lin(H, KV_HEADS * D, bias=False)
        self.wo, self.w1, self.w2, self.w3 = lin(H, H, bias=False), lin(H, FFN, bias=False), lin(FFN, H, bias=False), \
            lin(H, FFN, bias=False)
        self.attention_norm, self.ffn_norm = _RMSNorm(), _RMSNorm()

    def forward(self, x: Any, freqs: Any) -> Any:
        b, s, _ = x.shape
        h = self.attention_norm(x)
        q = _rope(self.wq(h).view(b, s, HEADS, D), freqs)
        k = _repeat_kv(_rope(self.wk(h).view(b, s, KV_HEADS, D), freqs), HEADS // KV_HEADS)
        v = _repeat_kv(self.wv(h).view(b, s, KV_HEADS, D), HEADS // KV_HEADS)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).contiguous().view(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


_SAVE = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
         torch.ops.aten._scaled_dot_product_efficient_attention.default,
         torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}  # the CPU SDPA stands in for flash


def _context() -> Any:
    """torchtitan's op-level policy with a fresh counter per checkpoint call."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    meta: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        save = func in _SAVE and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class _Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _Block().to(torch.bfloat16)

    def forward(self, x: Any, freqs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.block, x, freqs, use_reentrant=False, context_fn=_context)


def kept_bytes(compiled: bool) -> int:
    """Net bytes one checkpointed forward leaves allocated, less its output (the third of three steps)."""
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    module: Any = _Checkpointed()
    if compiled:
        module = torch.compile(module)
    x = torch.randn(B, S, H, dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.polar(torch.ones(S, D // 2), torch.randn(S, D // 2))
    kept = 0
    for _ in range(3):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            y = module(x, freqs)
        kept = sum(e.self_cpu_memory_usage for e in prof.key_averages()) - y.numel() * y.element_size()
        y.float().sum().backward()
        del y
    return kept


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_compiled_op_sac_drops_the_outputs_only_the_residual_reads() -> None:
    shape = activation_shape(TrainConfig(global_batch_seqs=B, micro_batch_size=B, seq_len=S), LayoutConfig(), SPEC)
    block_input = 2.0 * B * S * H
    eager, compiled = kept_bytes(False), kept_bytes(True)
    assert eager == pytest.approx(op_sac_activation_bytes(SPEC, shape) - block_input, rel=TOLERANCE)
    assert compiled == pytest.approx(op_sac_activation_bytes(SPEC, shape, compiled=True) - block_input, rel=TOLERANCE)
    # the difference is w2's bf16 output, tokens x h: what the eager SAC cache holds and the compiled graph drops
    assert eager - compiled == pytest.approx(2.0 * B * S * H, rel=0.05)
