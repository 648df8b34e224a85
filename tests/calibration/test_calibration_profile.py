"""Calibrated profiles without torch: the format, its validation, and how simtrain uses a profile.

Profiles here are built by the real writer (``calibration.writer.build_profile``) from synthetic
journal records with known numbers, so every assertion can be checked by hand.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from calibration.journal import measurement_key
from calibration.writer import build_profile, write_profile
from simtrain import simulate
from simtrain.cli.main import main
from simtrain.cost.collectives import MeasuredCandidate, collective_candidates, idle_time, plan_collective
from simtrain.cost.costs import ComputeCostModel
from simtrain.hardware.calibrated import (
    CollectiveTable,
    Curve,
    GemmModel,
    busbw_factor,
    gemm_role,
    in_layer,
    memory_op_kind,
)
from simtrain.hardware.profile import compute_calibration, load_profile, run_cluster
from simtrain.hardware.topology import Topology
from simtrain.spec.errors import ConfigError
from simtrain.studies.simulate import cluster_of

CPU_CONFIG = str(Path(__file__).parent / "data" / "cpu_llama.yaml")
FSDP_EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "llama3_8b_h100_fsdp.yaml")
MiB = 1024**2
GEMM_FLOPS_PER_S = 100e9  # the synthetic device: t = 10 us + 2mnk / 100 GFLOP/s
LINK_BPS = 1e9  # synthetic collectives: t = 100 us + busbw bytes / 1 GB/s
HOST_D2H_BPS, HOST_H2D_BPS = 50e9, 40e9  # synthetic device <-> pinned host copies


def rec(kind: str, params: dict[str, Any], median_s: float, **extra: Any) -> dict[str, Any]:
    return {"key": measurement_key(kind, params), "kind": kind, "params": params, "status": "ok",
            "stats": {"median_s": median_s, "p25_s": median_s * 0.99, "p75_s": median_s * 1.01, "repeats": 5}, **extra}


def gemm_s(m: int, n: int, k: int) -> float:
    return 1e-5 + 2.0 * m * n * k / GEMM_FLOPS_PER_S


def coll_s(kind: str, p: int, size: float) -> float:
    return 1e-4 + busbw_factor(kind, p) * size / LINK_BPS


def records(ranks: int = 2) -> list[dict[str, Any]]:
    out = [rec("launch", {}, 2e-6)]
    out += [rec("copy", {"bytes": b}, 2 * b / 10e9, moved_bytes=2 * b) for b in (MiB, 4 * MiB, 16 * MiB)]
    out += [rec("host_copy", {"bytes": 16 * MiB, "direction": d}, 16 * MiB / rate, moved_bytes=16 * MiB)
            for d, rate in (("d2h", HOST_D2H_BPS), ("h2d", HOST_H2D_BPS))]
    for m in (128, 512, 2048):
        for n in (128, 512, 2048):
            for k in (128, 512, 2048):
                out.append(rec("gemm", {"kernel": "", "role": "fwd", "m": m, "n": n, "k": k}, gemm_s(m, n, k),
                               flops=2.0 * m * n * k))
    out.append(rec("gemm", {"kernel": "qkv", "role": "fwd", "m": 512, "n": 1024, "k": 512, "parts": [512, 256, 256]},
                   0.123, flops=2.0 * 512 * 1024 * 512))
    for s in (64, 256, 512):
        fl = 4.0 * 2 * s * s * 8 * 64 * 0.5
        key = {"b": 2, "s_q": s, "s_kv": s, "heads": 8, "kv_heads": 4, "d": 64, "causal": True}
        out.append(rec("attention", {**key, "backward": False}, 1e-5 + fl / 50e9, flops=fl))
        out.append(rec("attention", {**key, "backward": True}, 1e-5 + 2.5 * fl / 40e9, flops=2.5 * fl))
    for op in ("norm", "norm.bwd", "act", "act.bwd", "rope", "rope.bwd", "residual", "cross_entropy",
               "cross_entropy.bwd", "embedding", "embedding.bwd"):
        for rows in (128, 512, 2048):
            nb = rows * 512 * 6.0
            out.append(rec("memory_op", {"op": op, "rows": rows, "cols": 512}, 5e-6 + nb / 5e9, sim_bytes=nb))
    for layers, nb in ((1, 2e8), (4, 5e8)):
        out.append(rec("optimizer", {"layers": layers, "params": [[4, 4]]}, 1e-3 + nb / 5e9, sim_bytes=nb))
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send"):
        p = 2 if kind == "send" else ranks
        for size in (1024, 64 * 1024, 4 * MiB, 64 * MiB):
            out.append(rec("collective", {"collective": kind, "ranks": p, "nodes": 1, "size_bytes": size,
                                          "members": list(range(p))}, coll_s(kind, p, size)))
    for cls, f in (("gemm", 1.9), ("attention", 1.8), ("memory", 1.5)):
        out.append({"key": f"contention|{cls}", "kind": "contention", "params": {"processes": ranks, "op_class": cls},
                    "status": "ok", "result": {"solo_s": 1.0, "concurrent_s": f, "factor": f}})
    out.append({"key": "interference", "kind": "interference", "status": "ok",
                "params": {"ranks": ranks, "nodes": 1, "comm_bytes": 64 * MiB},
                "result": {"gemm_s": 1.0, "gemm_with_comm_s": 1.5, "slowdown": 0.5,
                           "comm_s": 0.1, "comm_with_gemm_s": 0.18, "comm_slowdown": 0.8}})
    return out


def header(kind: str = "cpu", count: int = 2) -> dict[str, Any]:
    cuda = kind == "cuda"
    return {"fingerprint": f"{kind}:test", "device": {
        "kind": kind, "name": "NVIDIA H100 80GB HBM3" if cuda else "Test CPU", "count": count,
        "dtype": "bf16" if cuda else "fp32", "threads_per_process": 1, "base_gpu": "h100-sxm" if cuda else None,
        "memory_bytes": 80e9 if cuda else 16e9, "driver": None, "clocks": {}, "versions": {"torch": "test"}}}


def make_profile(root: Path, name: str, kind: str = "cpu", ranks: int = 2) -> Path:
    pytest.importorskip("scipy")  # the writer's fits (calibration extra); the tests without a profile run anyway
    folder = root / "calibrated" / name
    return write_profile(folder, build_profile(name, header(kind, ranks), records(ranks)))


# -- the functions ------------------------------------------------------------------------------------


def test_curve_interpolates_in_log_space_and_extrapolates_with_the_fit() -> None:
    c = Curve(x=(1.0, 100.0), t_s=(1.0, 10.0), a_s=0.5, rate=10.0)
    assert c(1.0) == pytest.approx(1.0) and c(100.0) == pytest.approx(10.0)
    assert c(10.0) == pytest.approx(math.sqrt(10.0))  # halfway in log x is the geometric mean
    assert c(1000.0) == pytest.approx(10.0 * c.fit(1000.0) / c.fit(100.0))  # continuous at the last point
    assert c(0.5) == pytest.approx(1.0 * c.fit(0.5) / c.fit(1.0))


def test_gemm_model_prefers_measured_then_fitted() -> None:
    g = GemmModel(t0_s=0.0, peak_flops_per_s={"fwd": 1e9}, m_half=1.0, n_half=1.0, k_half=1.0,
                  points={("", "fwd", 10, 10, 10): 5.0, ("qkv", "fwd", 10, 20, 10): 7.0})
    assert g.time_s("fwd", 10, 10, 10) == 5.0
    assert g.time_s("fwd", 10, 20, 10, kernel="qkv") == 7.0  # composite: as the stack runs it
    assert g.time_s("fwd", 10, 10, 10, kernel="qkv") == 5.0  # falls back to the plain GEMM
    far = g.time_s("dgrad", 10_000, 10_000, 10_000)
    assert far == pytest.approx(g.fitted_s("dgrad", 10_000, 10_000, 10_000))  # outside the box: the fit alone


@pytest.mark.parametrize("name,kind", [("ln1", "norm"), ("ln2.bwd", "norm.bwd"), ("final_norm", "norm"),
                                       ("residual2", "residual"), ("optimizer.step", "optimizer.step"),
                                       ("cross_entropy.bwd", "cross_entropy.bwd"), ("pos_embedding", "copy"),
                                       ("something_new", "copy")])
def test_memory_op_kinds(name: str, kind: str) -> None:
    assert memory_op_kind(name) == kind


def test_gemm_roles() -> None:
    assert [gemm_role(n) for n in ("qkv", "qkv.dgrad", "mlp_up.wgrad")] == ["fwd", "dgrad", "wgrad"]


def test_busbw_factors_follow_nccl_tests() -> None:
    assert busbw_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert busbw_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert busbw_factor("send", 2) == 1.0


# -- the file -------------------------------------------------------------------------------------------


def test_profile_round_trip(profiles_dir: Path) -> None:
    make_profile(profiles_dir, "test-cpu")
    prof = load_profile("test-cpu")
    assert prof.kind == "cpu" and prof.max_processes == 2 and prof.contention[2]["gemm"] == pytest.approx(1.9)
    assert prof.compute.gemm is not None
    assert prof.compute.gemm.time_s("fwd", 512, 512, 512) == pytest.approx(gemm_s(512, 512, 512))
    fit = prof.compute.gemm.fitted_s("fwd", 1024, 1024, 1024)
    assert fit == pytest.approx(gemm_s(1024, 1024, 1024), rel=0.05)  # the model fits the synthetic law
    assert prof.compute.memory_op_s("ln1", 512 * 512 * 6.0) == pytest.approx(5e-6 + 512 * 512 * 6.0 / 5e9, rel=1e-6)
    timing = prof.collectives.timing("all_reduce", 2, 1, 4 * MiB)
    assert timing is not None and timing[1] == pytest.approx(coll_s("all_reduce", 2, 4 * MiB))
    assert prof.summary["memory_Bps"] == pytest.approx(10e9)
    text = (profiles_dir / "calibrated" / "test-cpu" / "profile.yaml").read_text()
    assert text.rstrip().endswith("end_of_profile: true") and "busbw_Bps" in text


def _corrupt(path: Path, how: str) -> None:
    text = path.read_text()
    if how == "truncated":
        path.write_text(text[: len(text) // 2])
    elif how == "truncated_at_line":
        path.write_text("".join(text.splitlines(keepends=True)[:60]))
    elif how == "wrong_version":
        path.write_text(text.replace("schema_version: 1", "schema_version: 99"))
    elif how == "not_yaml":
        path.write_text("schema: [unclosed\n  : :")
    elif how == "bad_number":
        data = yaml.safe_load(text)
        data["fits"]["gemm"]["t0_s"] = "fast"
        data["fits"]["memory_ops"]["norm"]["x"] = [3.0, 2.0, 1.0]
        path.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.mark.parametrize("how,needle", [("truncated", None), ("truncated_at_line", "truncated"),
                                        ("wrong_version", "schema_version"), ("not_yaml", "malformed"),
                                        ("bad_number", "t0_s")])
def test_bad_profiles_are_clear_config_errors(profiles_dir: Path, how: str, needle: str | None,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = make_profile(profiles_dir, "broken")
    _corrupt(path, how)
    with pytest.raises(ConfigError) as err:
        load_profile("broken")
    assert str(path.resolve()) in str(err.value) or "profile.yaml" in str(err.value)
    if needle:
        assert needle in str(err.value)
    assert main(["simulate", CPU_CONFIG, "--set", "hardware.profile=broken"]) == 2
    out = capsys.readouterr().err
    assert "profile.yaml" in out and "Traceback" not in out


def test_unknown_profile_lists_the_valid_ones(profiles_dir: Path) -> None:
    make_profile(profiles_dir, "one")
    with pytest.raises(ConfigError, match="valid calibrated profiles: example-cpu, one "):
        load_profile("two")


def test_profile_by_path(profiles_dir: Path) -> None:
    path = make_profile(profiles_dir, "by-path")
    assert load_profile(str(path)).name == "by-path"
    assert load_profile(str(path.parent)).name == "by-path"


# -- simtrain with a profile -----------------------------------------------------------------------


def test_cpu_profile_predicts_a_cpu_run(profiles_dir: Path) -> None:
    make_profile(profiles_dir, "this-cpu")
    one = simulate(CPU_CONFIG, ["hardware.profile=this-cpu"])
    two = simulate(CPU_CONFIG, ["hardware.profile=this-cpu", "layout.dp=2", "train.global_batch_seqs=4"])
    assert one.n_gpus == 1 and two.n_gpus == 2
    assert two.step_time_s > 1.5 * one.step_time_s  # two processes share the cores (contention 1.5-1.9)
    assert two.breakdown_s["compute"] == pytest.approx(one.breakdown_s["compute"] * 1.9, rel=0.1)


def test_cpu_profile_limits(profiles_dir: Path) -> None:
    make_profile(profiles_dir, "this-cpu")
    with pytest.raises(ConfigError, match="at most 2"):
        simulate(CPU_CONFIG, ["hardware.profile=this-cpu", "layout.dp=4", "train.global_batch_seqs=8"])
    with pytest.raises(ConfigError, match="hardware.node"):
        simulate(CPU_CONFIG, ["hardware.profile=this-cpu", "hardware.node=dgx-h100"])


def test_cuda_profile_replaces_the_defaults(profiles_dir: Path) -> None:
    make_profile(profiles_dir, "my-h100", kind="cuda", ranks=8)
    default = simulate(FSDP_EXAMPLE)
    calibrated = simulate(FSDP_EXAMPLE, ["hardware.profile=my-h100"])
    assert calibrated.step_time_s != pytest.approx(default.step_time_s, rel=0.01)
    from simtrain.plan.load import load_config

    run = load_config(FSDP_EXAMPLE, ["hardware.profile=my-h100"])
    gpu = cluster_of(run).gpu
    cost = ComputeCostModel(gpu, calibration=compute_calibration(gpu))
    assert cost.gemm("qkv", 512, 1024, 512).time_s == pytest.approx(0.123)  # the composite, as measured
    assert cost.gemm("out_proj", 512, 512, 512).time_s == pytest.approx(gemm_s(512, 512, 512))
    assert gpu.comm_interference_nvlink == pytest.approx(0.5)
    assert gpu.comm_in_situ_slowdown == pytest.approx(0.8)  # the all-reduce beside GEMMs took 1.8x as long


def test_measured_collective_curve_replaces_the_link_model(profiles_dir: Path) -> None:
    make_profile(profiles_dir, "my-h100", kind="cuda", ranks=8)
    from simtrain.plan.load import load_config

    cluster = cluster_of(load_config(FSDP_EXAMPLE, ["hardware.profile=my-h100"]))
    topo = Topology(cluster)
    gpus = tuple(range(8))
    cands = collective_candidates("all_reduce", gpus, topo, cluster.gpu)
    assert len(cands) == 1 and isinstance(cands[0], MeasuredCandidate)
    size = 4 * MiB  # a measured size (between sizes the curve is interpolated in log-log space)
    plan = plan_collective("all_reduce", gpus, size, topo, cluster.gpu)
    t = plan.latency_s + idle_time(lambda e: topo.edge(*e).bandwidth_Bps, plan.phases)
    assert t == pytest.approx(coll_s("all_reduce", 8, size), rel=1e-6)
    assert collective_candidates("all_reduce", (0, 1), topo, cluster.gpu)[0].algorithm != "measured"  # not measured


def test_calibrated_node_is_the_calibrated_machine(profiles_dir: Path) -> None:
    make_profile(profiles_dir, "my-h100", kind="cuda", ranks=8)
    from simtrain.spec.config import HardwareConfig

    cluster = run_cluster(HardwareConfig(node="calibrated", profile="my-h100"), 1)
    assert cluster.n_gpus == 1 and cluster.gpu.name == "h100-sxm"
    with pytest.raises(ConfigError, match="had 8"):
        run_cluster(HardwareConfig(node="calibrated", profile="my-h100"), 16)


def test_measured_host_copy_rate_sets_the_offload_link_unless_the_config_names_one(profiles_dir: Path) -> None:
    """CPU activation offloading copies at the profile's measured device <-> host rate, the slower of
    its two directions; ``hardware.host_copy_GBps`` in the config still wins (a what-if)."""
    from simtrain.spec.config import HardwareConfig

    make_profile(profiles_dir, "my-h100", kind="cuda", ranks=8)
    assert load_profile("my-h100").summary["host_copy_Bps"] == pytest.approx(HOST_H2D_BPS)
    cluster = run_cluster(HardwareConfig(node="dgx-h100", profile="my-h100"), 8)
    assert cluster.node.host_link_Bps == pytest.approx(HOST_H2D_BPS)
    what_if = run_cluster(HardwareConfig(node="dgx-h100", profile="my-h100", host_copy_GBps=100.0), 8)
    assert what_if.node.host_link_Bps == pytest.approx(100e9)
    make_profile(profiles_dir, "this-cpu")
    cpu = run_cluster(HardwareConfig(node="calibrated", profile="this-cpu"), 1)
    assert cpu.node.host_link_Bps == pytest.approx(HOST_H2D_BPS)


def test_collective_table_is_none_for_unmeasured_groups() -> None:
    table = CollectiveTable({("all_reduce", 2, 1): Curve((1.0, 2.0), (1.0, 2.0), 0.0, 1.0)})
    assert table.timing("all_reduce", 4, 1, 10.0) is None


def test_in_situ_factor_scales_kernels_but_not_the_optimizer(profiles_dir: Path) -> None:
    path = make_profile(profiles_dir, "situ")
    data = yaml.safe_load(path.read_text())
    data["summary"]["in_situ"] = 1.5
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    prof = load_profile("situ")
    assert prof.compute.gemm_s("out_proj", 512, 512, 512) == pytest.approx(1.5 * gemm_s(512, 512, 512))
    assert prof.compute.memory_op_s("optimizer.step", 2e8) == pytest.approx(1e-3 + 2e8 / 5e9)


@pytest.mark.parametrize("name", ["lm_head", "lm_head.dgrad", "lm_head.wgrad"])
def test_in_situ_factor_leaves_the_kernels_outside_the_layers_alone(profiles_dir: Path, name: str) -> None:
    """The in-situ factor is measured on a decoder layer (its small ops between kernels); the LM head's
    GEMMs, the loss and the embedding run in a real step as long as alone (issue 29 part 5), so a layer's
    factor does not multiply them; layer kernels with the same shape and kind still get it."""
    path = make_profile(profiles_dir, "situ-head")
    data = yaml.safe_load(path.read_text())
    data["summary"]["in_situ"] = 1.5
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    c = load_profile("situ-head").compute
    assert c.gemm_s(name, 512, 512, 512) == pytest.approx(gemm_s(512, 512, 512))
    assert c.gemm_s("mlp_down", 512, 512, 512) == pytest.approx(1.5 * gemm_s(512, 512, 512))
    assert c.memory_op_s("final_norm", 1e6) == pytest.approx(c.memory_op_s("ln1", 1e6) / 1.5)
    for kernel in ("cross_entropy", "cross_entropy.bwd", "embedding", "embedding.bwd", "optimizer.step"):
        assert in_layer(kernel) is False
    assert all(in_layer(k) for k in ("qkv", "qkv.dgrad", "flash_attn.bwd", "ln2.bwd", "rope", "act", "residual1"))


def test_committed_profiles_load() -> None:
    from simtrain.hardware.profile import list_profiles

    names = list_profiles()
    assert "example-cpu" in names
    for name in names:
        assert load_profile(name).name == name
    r = simulate(CPU_CONFIG, ["hardware.profile=example-cpu", "layout.dp=2", "train.global_batch_seqs=4"])
    assert 0.1 < r.step_time_s < 10.0


# -- kernels timed inside training steps (calibration.instep) ---------------------------------------


@pytest.mark.parametrize(("phase", "shapes", "kernel"), [
    ("fwd", [(256, 64), (64, 4096)], "lm_head"),  # logits: tokens x hidden @ hidden x vocab
    ("bwd", [(256, 4096), (4096, 64)], "lm_head.dgrad"),  # inner dimension the vocabulary
    ("bwd", [(4096, 256), (256, 64)], "lm_head.wgrad"),  # dW as autograd computes it for a transposed weight
    ("bwd", [(64, 256), (256, 4096)], "lm_head.wgrad"),  # dW^T
    ("fwd", [(256, 256), (256, 4096)], "lm_head"),  # tokens == hidden: the phase tells fwd from wgrad
    ("bwd", [(256, 256), (256, 4096)], "lm_head.wgrad"),
    ("fwd", [(256, 64), (64, 176)], None),  # a layer's GEMM
    ("bwd", [(256, 176), (176, 64)], None),
    ("fwd", [(256, 4096)], None),  # not an mm
    ("fwd", [], None),
])
def test_in_step_books_the_lm_heads_gemms_by_shape_and_phase(phase: str, shapes: list[tuple[int, ...]],
                                                              kernel: str | None) -> None:
    from calibration.instep import book

    assert book(phase, "mm", shapes, 4096) == kernel


def test_in_step_books_the_loss_and_the_embedding() -> None:
    from calibration.instep import book

    assert book("fwd", "_log_softmax", [(256, 4096)], 4096) == "cross_entropy"
    assert book("fwd", "nll_loss_forward", [(256, 4096), (256,)], 4096) == "cross_entropy"
    assert book("bwd", "_log_softmax_backward_data", [(256, 4096)] * 2, 4096) == "cross_entropy.bwd"
    assert book("bwd", "nll_loss_backward", [(), (256, 4096), (256,)], 4096) == "cross_entropy.bwd"
    assert book("fwd", "embedding", [(4096, 64), (2, 128)], 4096) == "embedding"
    assert book("bwd", "embedding_dense_backward", [(2, 128, 64), (2, 128)], 4096) == "embedding.bwd"
    assert book("bwd", "_log_softmax", [(256, 4096)], 4096) is None  # a forward op seen in the backward
    assert book("opt", "sqrt", [(4096, 64)], 4096) is None


def test_in_step_kernels_are_the_regions_between_a_plain_steps_clock_stamps() -> None:
    """Each kernel outside the layers is the time between two of the step's clock stamps (the layers'
    regions are not booked), the LM head's backward is split by the weight gradient's share, and the
    optimizer's region runs from the backward's end to after ``zero_grad``."""
    from calibration.instep import STAMPS, kernel_seconds

    t = dict(zip(STAMPS, (0.0, 0.001, 0.101, 0.131, 0.141, 0.161, 0.201, 0.401, 0.403, 0.453), strict=True))
    out = kernel_seconds(t, 0.75)
    assert out == pytest.approx({"embedding": 0.001, "lm_head": 0.030, "cross_entropy": 0.010,
                                 "cross_entropy.bwd": 0.020, "lm_head.dgrad": 0.010, "lm_head.wgrad": 0.030,
                                 "embedding.bwd": 0.002, "optimizer.step": 0.050})
    layers = (t["head_in"] - t["embedded"]) + (t["embedded_grad"] - t["head_grad"])
    assert sum(out.values()) == pytest.approx(t["optimized"] - t["start"] - layers)


def test_kernels_timed_in_a_step_replace_their_isolated_times_at_the_target(profiles_dir: Path) -> None:
    """An ``in_step`` record (the LM head, loss, embedding and optimizer timed inside training steps)
    becomes the LM head's GEMM points under the kernel name ``lm_head`` and the target's point of the
    loss, embedding and optimizer curves, replacing the other timings at that size; other sizes keep theirs."""
    from calibration.instep import lm_head_shapes
    from calibration.shapes import Target, kernel_calls, read_run

    run = read_run(CPU_CONFIG)
    target = Target(run.model, seq_len=run.train.seq_len, micro_batch_size=run.train.micro_batch_size)
    sim_bytes = kernel_calls(target).memory_bytes
    ce = sim_bytes["cross_entropy"]
    hdr = {**header(), "calibrated_for": {**target.describe(), "model_spec": run.model.model_dump()}}
    isolated = [rec("memory_op", {"op": "cross_entropy", "rows": r}, 1e-3 * f, sim_bytes=ce * f)
                for r, f in ((1, 0.25), (2, 1.0), (3, 4.0))]
    isolated.append(rec("optimizer", {"layers": 9, "params": [[4, 4]]}, 0.01, sim_bytes=sim_bytes["optimizer.step"]))
    kernels = {"lm_head": 0.05, "lm_head.dgrad": 0.04, "lm_head.wgrad": 0.06, "cross_entropy": 0.03,
               "cross_entropy.bwd": 0.02, "embedding": 1e-4, "embedding.bwd": 0.004, "optimizer.step": 0.07}
    steps = [{"key": f"in_step|{i}", "kind": "in_step", "params": {**target.describe(), "round": i}, "status": "ok",
              "stats": {}, "result": {"kernels": {k: {"median_s": v * (1 + 0.1 * i)} for k, v in kernels.items()}}}
             for i in range(3)]  # three rounds: the median is the middle one
    folder = profiles_dir / "calibrated" / "instep"
    pytest.importorskip("scipy")
    write_profile(folder, build_profile("instep", hdr, records() + isolated + steps))
    c = load_profile("instep").compute
    for name, (m, n, k) in lm_head_shapes(target).items():
        assert c.gemm_s(name, m, n, k) == pytest.approx(1.1 * kernels[name])
        assert c.gemm is not None and c.gemm.time_s(gemm_role(name), m, n, k) != pytest.approx(1.1 * kernels[name])
    for name in ("cross_entropy", "cross_entropy.bwd", "embedding.bwd", "optimizer.step"):
        assert c.memory_op_s(name, sim_bytes[name]) == pytest.approx(1.1 * kernels[name])
    assert c.memory_op_s("cross_entropy", 4 * ce) == pytest.approx(4e-3)  # isolated at another size
    assert c.memory_op_s("lm_head_is_not_a_memory_op", ce) == c.memory_op_s("copy", ce)
