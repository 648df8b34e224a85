"""Property tests: random small configurations either fail cleanly or give a sane result."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError, InfeasibleLayout
from simtrain.studies.simulate import simulate

STATIC_KEYS = ("weights", "grads", "optimizer", "comm_buffers", "workspace", "context")


@st.composite
def models(draw) -> dict:
    heads = draw(st.sampled_from([4, 8, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, 8, 16) if h <= heads and heads % h == 0]))
    style = draw(st.sampled_from(["gpt", "llama"]))
    return dict(
        name="rand", n_layers=draw(st.sampled_from([2, 3, 4, 6, 8])),
        hidden=draw(st.sampled_from([256, 512, 1024])), n_heads=heads,
        n_kv_heads=kv if style == "llama" else None,
        ffn_hidden=draw(st.sampled_from([512, 1024, 2048, 1376])),
        activation="gelu" if style == "gpt" else "swiglu",
        norm="layernorm" if style == "gpt" else "rmsnorm",
        position=draw(st.sampled_from(["rope", "learned"])), max_position=4096,
        vocab=draw(st.sampled_from([1024, 4096, 32000, 1000])),
        tied_embeddings=draw(st.booleans()), linear_bias=style == "gpt",
    )


@st.composite
def configs(draw) -> dict:
    n_nodes = draw(st.integers(1, 4))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    world = 8 * n_nodes
    dp = world // (tp * pp) if world % (tp * pp) == 0 and draw(st.integers(0, 9)) else draw(st.integers(1, 8))
    dp = max(dp, 1)
    vpp = draw(st.sampled_from([1, 1, 2]))
    fsdp = draw(st.sampled_from(["none", "none", "full", "hybrid"]))
    layout = dict(
        dp=dp, tp=tp, pp=pp, vpp=vpp,
        zero_stage=draw(st.sampled_from([0, 1, 2, 3])) if fsdp == "none" else 0,
        fsdp=fsdp, sequence_parallel=tp > 1 and draw(st.booleans()),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        overlap_grad_reduce=draw(st.booleans()), overlap_param_gather=draw(st.booleans()),
        tp_comm_overlap=draw(st.booleans()),
        offload_activation_layers=draw(st.sampled_from([0, 0, 0, 1, 3])),
    )
    if fsdp == "hybrid":
        layout["fsdp_shard_size"] = draw(st.sampled_from([1, 2, 4, 8]))
    if draw(st.integers(0, 4)) == 0:
        layout["schedule"] = draw(st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b"]))
    mbs = draw(st.sampled_from([1, 2]))
    seqs = dp * mbs * draw(st.sampled_from([1, 2, 4, 8])) if draw(st.integers(0, 9)) else draw(st.integers(1, 64))
    train = dict(seq_len=draw(st.sampled_from([256, 512, 1024])), micro_batch_size=mbs, global_batch_seqs=seqs,
                 attention_kernel=draw(st.sampled_from(["flash", "unfused"])),
                 grad_dtype=draw(st.sampled_from(["fp32", "bf16"])),
                 optimizer=draw(st.sampled_from(["adamw", "sgd"])))
    return dict(model=draw(models()), hardware=dict(n_nodes=n_nodes), layout=layout, train=train)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cfg=configs(), again=st.integers(0, 9))
def test_random_configs_fail_cleanly_or_are_sane(cfg: dict, again: int) -> None:
    try:
        res = simulate(cfg)
    except ConfigError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
        assert str(exc)
        return
    except InfeasibleLayout as exc:
        assert str(exc)
        return
    assert math.isfinite(res.step_time_s) and res.step_time_s > 0
    assert 0 < res.mfu <= 1
    assert 0 < res.hfu <= 1
    assert res.hfu >= res.mfu * 0.5  # hardware FLOPs include the model FLOPs (and recompute)
    bd = res.breakdown_s
    for k in ("compute", "bubble", "optimizer", "other"):
        assert bd[k] >= 0, k
    assert all(v >= 0 for v in bd["exposed_comm"].values())
    assert bd["compute"] > 0
    assert len(res.memory) == cfg["layout"]["pp"]
    for m in res.memory:
        assert m.peak_bytes >= m.components["weights"] > 0
        static = sum(m.components.get(k, 0.0) for k in STATIC_KEYS)
        assert min(v for _, v in m.timeline) >= static * (1 - 1e-12)
        assert m.peak_bytes == pytest.approx(m.closed_form_peak_bytes, rel=0.01)
    if again == 0:
        assert simulate(cfg).to_dict(timeline=True) == res.to_dict(timeline=True)


def test_determinism() -> None:
    cfg = dict(model=dict(name="t", n_layers=4, hidden=512, n_heads=8, ffn_hidden=1024, activation="swiglu",
                          norm="rmsnorm", position="rope", vocab=4096, tied_embeddings=False, linear_bias=False),
               hardware=dict(n_nodes=2, nics_per_node=4),
               layout=dict(dp=4, tp=2, pp=2, zero_stage=1, sequence_parallel=True),
               train=dict(seq_len=512, global_batch_seqs=16))
    a = simulate(cfg, mode="full").to_dict(timeline=True)
    b = simulate(cfg, mode="full").to_dict(timeline=True)
    assert a == b
    assert simulate(cfg).to_dict() == simulate(cfg).to_dict()


# -- fast validation fuzzing ---------------------------------------------------------------------

VALUES = st.one_of(st.integers(-4, 130), st.sampled_from([0, -1, 1.5, "x", None, True, [1], {"a": 1}]))
FIELDS = {
    "layout": ["dp", "tp", "pp", "cp", "ep", "vpp", "zero_stage", "fsdp", "fsdp_shard_size", "schedule",
               "recompute", "recompute_layers", "offload_activation_layers", "sequence_parallel", "grad_bucket_MiB", "order",
               "bogus"],
    "train": ["seq_len", "micro_batch_size", "global_batch_tokens", "global_batch_seqs", "optimizer",
              "precision", "grad_dtype", "attention_kernel", "nonsense"],
    "hardware": ["node", "gpu", "n_nodes", "nics_per_node", "nic_Gbps", "oversubscription", "nodes_per_leaf",
                 "host_copy_GBps"],
    "model": ["n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "activation"],
    "sim": ["mode", "fragmentation_ratio"],
}
PATH_PREFIXES = ("layout", "train", "hardware", "model", "sim", "name", "config", "--set")


@st.composite
def mutated(draw) -> dict:
    base = dict(model=dict(name="t", n_layers=8, hidden=512, n_heads=8, ffn_hidden=2048, activation="gelu",
                           norm="layernorm", position="rope", vocab=4096, tied_embeddings=False,
                           linear_bias=False),
                hardware=dict(n_nodes=2), layout=dict(dp=4, tp=2, pp=2),
                train=dict(seq_len=1024, global_batch_seqs=32))
    for _ in range(draw(st.integers(1, 4))):
        section = draw(st.sampled_from(sorted(FIELDS)))
        key = draw(st.sampled_from(FIELDS[section]))
        base.setdefault(section, {})[key] = draw(VALUES)
    return base


@settings(max_examples=2000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=mutated())
def test_validation_errors_name_a_dotted_path(cfg: dict) -> None:
    try:
        run = load_config(cfg)
    except ConfigError as exc:
        assert exc.problems
        for p in exc.problems:
            assert p.message
            assert p.path.split(".")[0] in PATH_PREFIXES, p
        return
    # accepted configs satisfy the cross-field rules
    lay = run.layout
    assert lay.world_size == 8 * run.hardware.n_nodes
    assert run.model.n_heads % lay.tp == 0 and lay.pp <= run.model.n_layers
    assert run.train.global_batch_seqs_resolved % (run.train.micro_batch_size * lay.dp) == 0
