"""CPU activation offloading (``layout.offload_activation_layers``; ``simtrain.lower.offload``)."""

from __future__ import annotations

import copy

import pytest

from simtrain.cost.cost_pass import lower
from simtrain.cost.costs import ComputeCostModel
from simtrain.engine.engine import Engine
from simtrain.hardware.load import build_cluster, load_node
from simtrain.hardware.topology import Topology
from simtrain.lower.offload import copy_s, stall_s, sync_layers, windows
from simtrain.lower.ops import OpKind, Stream
from simtrain.plan.layout import RankGrid
from simtrain.plan.load import load_config
from simtrain.spec.errors import ConfigError
from simtrain.studies.estimate import Estimator
from simtrain.studies.simulate import cluster_of, simulate

L = 8
ONE_GPU = {"model": {"preset": "llama3-8b", "n_layers": L},
           "hardware": {"node": "dgx-h100", "n_nodes": 1, "gpus_per_node": 1},
           "layout": {"dp": 1}, "train": {"seq_len": 2048, "global_batch_seqs": 2}}


def _cfg(n: int, base: dict = ONE_GPU, **layout: object) -> dict:
    cfg = copy.deepcopy(base)
    cfg["layout"].update(offload_activation_layers=n, **layout)
    return cfg


@pytest.mark.parametrize(("n_layers", "n"), [(80, 20), (80, 40), (80, 60), (80, 79), (32, 5), (5, 4), (7, 3), (2, 1)])
def test_sync_points_spread_over_the_layers_as_transformer_engine_does(n_layers: int, n: int) -> None:
    w = sync_layers(n_layers, n)
    assert len(w) == n and w[-1] == n_layers - 1
    assert all(w[k] >= k + 1 for k in range(n))  # copy k + 1 starts after layer k + 1 ran
    assert w == sorted(set(w))
    covered = [j for win in windows(n_layers, n) for j in win]
    assert covered == list(range(1, n_layers))  # the windows tile layers 1 .. L-1
    q = n_layers // n
    assert {len(win) for win in windows(n_layers, n)[1:]} <= {q, q + 1}


def test_sync_points_known_cases() -> None:
    # TE layer_window_map: 80 layers, 20 offloaded -> every 4th layer; 60 -> first 20 windows of 2
    assert sync_layers(80, 20) == list(range(3, 80, 4))
    assert sync_layers(80, 60)[:21] == [*range(1, 40, 2), 40]
    with pytest.raises(ValueError):
        sync_layers(8, 8)


def test_stall_is_what_each_copy_exceeds_its_window() -> None:
    # 4 layers of 1 s, 2 offloaded: windows (0, 1] and (1, 3]; copies of 3 s and 1 s at 1 B/s
    assert sync_layers(4, 2) == [1, 3]
    assert stall_s([1.0] * 4, [3.0, 1.0, 5.0, 5.0], 1.0, 2) == pytest.approx((3 - 1) + 0.0)
    assert stall_s([1.0] * 4, [3.0, 1.0], 1.0, 0) == 0.0
    assert copy_s(52.8e9, 52.8e9) == pytest.approx(1.0)


def test_offloading_frees_activations_and_the_closed_form_peak_matches_the_ledger() -> None:
    peaks = []
    for n in (0, 2, 4, L - 1):
        r = simulate(_cfg(n))
        (mem,) = r.memory
        assert mem.peak_bytes == pytest.approx(mem.closed_form_peak_bytes, rel=1e-12)
        assert min(v for _, v in r.memory[0].timeline) >= -1e-6  # memory never negative
        peaks.append(mem.peak_bytes)
    run = load_config(_cfg(0))
    act = lower(run, ComputeCostModel(cluster_of(run).gpu, "bf16")).chunk_memory[0][0].fwd[1][0]  # layer 0
    frag = 1 + run.sim.fragmentation_ratio  # simulate's fragmentation share on top of the ledger
    for n, peak in zip((2, 4, L - 1), peaks[1:], strict=True):
        saved = (peaks[0] - peak) / frag
        # the end of forward holds L - n layers; backward's first sync reloads one of them again
        assert (n - 1) * act * (1 - 1e-9) <= saved <= n * act * (1 + 1e-9)


def _engine_run(n: int, host_Bps: float) -> tuple[float, float, float, list[float], list[float], list[float]]:
    """(step s, offload waits s, micro-batches, per-layer forward s, backward s, activation bytes) on one GPU."""
    run = load_config(_cfg(n))
    cl = cluster_of(run)
    low = lower(run, ComputeCostModel(cl.gpu, run.train.precision), host_Bps)
    eng = Engine(low.programs, RankGrid(run.layout), Topology(cl), cl.gpu, symmetric=True, trace=False)
    res = eng.run()
    (st,) = res.stats.values()
    est = Estimator(run.model, cl)
    plans = est.plans(run.layout, run.train)
    cost = est.cost_model(run.train)
    fwd = [sum(cost.kernel_time(k) for s in plans[i].fwd if isinstance(s, tuple) for k in s) for i in range(L)]
    bwd = [sum(cost.kernel_time(k) for s in plans[i].bwd if isinstance(s, tuple) for k in s) for i in range(L)]
    return res.step_time_s, st.exposed.get("offload", 0.0), low.microbatches, fwd, bwd, [plans[i].act_bytes
                                                                                           for i in range(L)]


def test_copies_hide_behind_compute_on_a_fast_link_and_stall_by_the_closed_form_on_a_slow_one() -> None:
    base, *_ = _engine_run(0, 1.0)
    fast, waits, *_ = _engine_run(5, 1e18)
    assert fast == pytest.approx(base, rel=1e-12) and waits == pytest.approx(0.0, abs=1e-12)
    for host in (2e9, 20e9):  # a copy of ~0.5-2 GB per layer against ~10-30 ms of compute
        step, waits, m, fwd, bwd, act = _engine_run(5, host)
        expected = m * (stall_s(fwd, act, host, 5) + stall_s(bwd, act, host, 5))
        assert expected > 0
        assert waits == pytest.approx(expected, rel=1e-9)
        assert step == pytest.approx(base + expected, rel=1e-9)


def test_copy_ops_run_on_their_own_streams_each_layer_once_per_direction() -> None:
    run = load_config(_cfg(3))
    cl = cluster_of(run)
    low = lower(run, ComputeCostModel(cl.gpu, "bf16"), cl.node.host_link_Bps)
    ops = low.programs[0].ops
    d2h = [o for o in ops if o.stream == Stream.OFFLOAD]
    h2d = [o for o in ops if o.stream == Stream.RELOAD]
    assert len(d2h) == len(h2d) == 3 * low.microbatches
    assert all(o.kind == OpKind.COPY and o.duration_s > 0 for o in d2h + h2d)
    assert d2h[0].duration_s == pytest.approx(d2h[0].comm_bytes / cl.node.host_link_Bps)


def test_estimate_adds_the_same_offload_waits_as_the_engine() -> None:
    """The layout search's closed form charges what the engine's copies cost (8 GPUs, 6 of 8 layers
    offloaded at 52.8 GB/s: ~0.13 s of waits) and the same peak memory."""
    base = {"model": {"preset": "llama3-8b", "n_layers": L}, "hardware": {"node": "dgx-h100", "n_nodes": 1},
            "layout": {"dp": 8, "zero_stage": 1, "grad_bucket_MiB": 40},  # the buckets this test was written with
            "train": {"seq_len": 4096, "global_batch_seqs": 16}}
    sims, ests = [], []
    for n in (0, 6):
        run = load_config(_cfg(n, base=base))
        r = simulate(run)
        est = Estimator(run.model, cluster_of(run)).estimate(run.layout, run.train)
        assert max(est.stage_peak_bytes) == pytest.approx(r.memory[0].peak_bytes, rel=1e-6)
        sims.append(r.step_time_s)
        ests.append(est.step_time_s)
    assert sims[1] - sims[0] > 0.05
    assert ests[1] - ests[0] == pytest.approx(sims[1] - sims[0], rel=0.01)


@pytest.mark.parametrize(("layout", "says"), [
    ({"offload_activation_layers": L}, "fewer layers"),
    ({"offload_activation_layers": 2, "pp": 2}, "pp = 1"),
    ({"offload_activation_layers": 2, "recompute": "full"}, "recompute = 'none'"),
])
def test_megatron_limits_are_clear_errors(layout: dict, says: str) -> None:
    cfg = copy.deepcopy(ONE_GPU)
    cfg["layout"].update(layout)
    cfg["hardware"]["gpus_per_node"] = 2
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    text = str(exc.value)
    assert "layout.offload_activation_layers" in text and says in text


def test_host_links_of_the_node_profiles() -> None:
    # PCIe Gen5 H100 ~52.8 GB/s (nvbandwidth#24), Gen4 A100 ~25 GB/s, GB200's Grace shared by two GPUs
    assert load_node("dgx-h100").host_link_Bps == pytest.approx(52.8e9)
    assert load_node("dgx-a100").host_link_Bps == pytest.approx(25.1e9)
    assert load_node("gb200-nvl72").host_link_Bps == pytest.approx(256e9)
    node = build_cluster("dgx-h100", 1).node.model_copy(update={"host_copy_Bps": 0.0})
    assert node.host_link_Bps == node.pcie_Bps  # a profile without the key falls back to its PCIe path


def test_host_copy_rate_override_is_a_what_if_and_bad_values_are_clear_errors() -> None:
    slow = _cfg(7)
    slow["hardware"]["host_copy_GBps"] = 5.0
    fast = _cfg(7)
    fast["hardware"]["host_copy_GBps"] = 500.0
    assert cluster_of(load_config(slow)).node.host_link_Bps == pytest.approx(5e9)
    r_slow, r_fast = simulate(slow), simulate(fast)
    assert r_slow.breakdown_s["offload"] > r_fast.breakdown_s["offload"] >= 0.0
    assert r_slow.step_time_s > r_fast.step_time_s
    bad = _cfg(2)
    bad["hardware"]["host_copy_GBps"] = -1
    with pytest.raises(ConfigError, match="hardware.host_copy_GBps"):
        load_config(bad)
