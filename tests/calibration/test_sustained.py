"""The device check's sustained-GEMM test and its out-of-sample comparison, on this CPU.

The sustained loop runs for real (torch on the CPU), nvidia-smi is a stand-in script on PATH that prints
readings as the driver's csv does, and the shipped-profile helpers are checked against the cost model's
closed form.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from calibration.device_compare import per_kernel, shipped_gemm_tflops, shipped_hardware  # noqa: E402
from calibration.sustained import Sample, SmiSampler, _parse, sustained_gemm  # noqa: E402
from simtrain.hardware.load import load_gpu  # noqa: E402

FAKE_SMI = """#!{python}
import sys, time
from datetime import datetime
while True:
    now = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    print(f"{{now}}, 1755, 690.50, 71", flush=True)
    time.sleep(0.02)
"""


def test_parse_reads_the_drivers_csv_and_skips_what_it_cannot() -> None:
    s = _parse("2026/12/07 02:40:01.250, 1755, 690.50, 71")
    assert s is not None and (s.sm_mhz, s.power_w, s.temp_c) == (1755.0, 690.5, 71.0)
    assert s.t == pytest.approx(time.mktime((2026, 12, 7, 2, 40, 1, 0, 0, -1)) + 0.25)
    # a field the driver does not report is left out, not the whole reading
    assert _parse("2026/12/07 02:40:01.250, [N/A], 690.50, 71") == Sample(s.t, None, 690.5, 71.0)
    assert _parse("2026/12/07 02:40:01.250, [N/A], [N/A], [N/A]") is None
    assert _parse("garbage") is None and _parse("12:40:01, 1755, 690.50, 71") is None


def test_between_takes_the_median_of_the_window_only() -> None:
    smi = SmiSampler(samples=[Sample(float(t), 1000.0 + t, 500.0 + t, 60.0 + t) for t in range(10)])
    c = smi.between(2.0, 4.0)
    assert c == {"sm_mhz": 1003.0, "power_w": 503.0, "temp_c": 63.0, "samples": 3.0}
    assert smi.between(20.0, 30.0) is None
    no_power = SmiSampler(samples=[Sample(1.0, 1500.0, None, 60.0), Sample(2.0, 1600.0, None, 70.0)])
    assert no_power.between(0.0, 3.0) == {"samples": 2.0, "sm_mhz": 1550.0, "temp_c": 65.0}


def test_sampler_reads_nvidia_smi_in_the_background(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(FAKE_SMI.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    t0 = time.time()
    with SmiSampler() as smi:
        gemm = sustained_gemm(torch.device("cpu"), torch.float32, 64, 0.6, window_s=0.1, sampler=smi)
    assert len(smi.samples) >= 5 and smi._proc is not None and smi._proc.poll() is not None  # stopped on exit
    assert all(t0 - 1 <= s.t <= time.time() + 1 for s in smi.samples)
    assert gemm["sustained_clocks"] == {"sm_mhz": 1755.0, "power_w": 690.5, "temp_c": 71.0}


def test_sustained_gemm_times_back_to_back_windows_on_the_cpu() -> None:
    g = sustained_gemm(torch.device("cpu"), torch.float32, 96, 0.5, window_s=0.05)
    ends = [w["end_s"] for w in g["windows"]]
    assert ends == sorted(ends) and ends[-1] >= 0.5 and len(ends) >= 5  # windows of 0.05 s by the clock
    assert all(w["gemms"] >= 1 for w in g["windows"])
    rates = [w["tflops"] for w in g["windows"][1:]]
    assert g["burst_tflops"] == rates[0] and g["max_tflops"] == max(rates)
    assert min(rates) <= g["sustained_tflops"] <= max(rates) and g["ratio"] == g["sustained_tflops"] / g["burst_tflops"]
    assert g["burst_clocks"] is None and g["sustained_clocks"] is None  # no nvidia-smi sampler given


def test_shipped_hardware_maps_cuda_device_names_to_the_shipped_profiles() -> None:
    assert shipped_hardware("NVIDIA H100 80GB HBM3") == ({"gpu": "h100-sxm", "node": "dgx-h100", "gpus_per_node": 1}, None)
    assert shipped_hardware("NVIDIA H200")[0]["gpu"] == "h200"
    hw, note = shipped_hardware("NVIDIA H100 NVL")
    assert hw["gpu"] == "h100-sxm" and note is not None and "NVL" in note


def test_shipped_gemm_rate_is_the_profiles_closed_form() -> None:
    # 8192^3 on H100: 64 x 64 = 4096 output tiles of 128 x 128 over 132 SMs -> 32 waves (wave quantisation
    # 4096 / 4224), depth factor 1 at the reference depth, plus the kernel's launch floor
    gpu = load_gpu("h100-sxm")
    flops = 2.0 * 8192**3
    t = flops / (gpu.bf16_flops_per_s * gpu.gemm_efficiency * 4096 / 4224) + gpu.kernel_launch_s
    assert shipped_gemm_tflops("h100-sxm", 8192) == pytest.approx(flops / t / 1e12, rel=1e-9)


def test_per_kernel_of_one_config_against_itself_is_one_everywhere() -> None:
    cfg = {"name": "pk", "model": "llama3-8b", "hardware": {"gpu": "h100-sxm", "gpus_per_node": 1}, "layout": {"dp": 1},
           "train": {"seq_len": 2048, "micro_batch_size": 1, "global_batch_seqs": 1}}
    rows = per_kernel(cfg, cfg)
    names = {r["kernel"] for r in rows}
    assert {"qkv", "mlp_up", "mlp_down.dgrad", "flash_attn.fwd", "lm_head", "optimizer.step"} <= names
    assert all(r["ratio"] == 1.0 for r in rows if r["calibrated_s"] > 0)
    longest = [max(r["calibrated_s"], r["shipped_s"]) for r in rows]
    assert longest == sorted(longest, reverse=True)
    # H200 has H100's compute and more bandwidth: no kernel slower, the memory-bound ones faster
    faster = per_kernel(cfg, {**cfg, "hardware": {"gpu": "h200", "gpus_per_node": 1}})
    assert all(r["ratio"] <= 1.0 + 1e-12 for r in faster if r["ratio"] is not None)
    assert any(r["ratio"] < 0.95 for r in faster if r["ratio"] is not None)


def test_busy_seconds_is_the_union_of_intervals() -> None:
    from calibration.step_trace import busy_seconds

    assert busy_seconds([]) == 0.0
    assert busy_seconds([(0.0, 1.0), (0.5, 1.5), (2.0, 3.0), (2.2, 2.8), (4.0, 4.0)]) == pytest.approx(2.5)
    assert busy_seconds([(3.0, 4.0), (0.0, 1.0)]) == pytest.approx(2.0)  # order does not matter


def test_trace_steps_writes_a_chrome_trace_and_its_summary(tmp_path: Path) -> None:
    import gzip
    import json

    from calibration.device_check import TINY
    from calibration.step_trace import trace_steps

    r = trace_steps(TINY, 32, 2, torch.device("cpu"), torch.float32, tmp_path / "trace", steps=2, warmup=1)
    assert r["trace"] == str(tmp_path / "trace.json.gz") and not list(tmp_path.glob("*.tmp.json"))
    events = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))["traceEvents"]
    assert any(e.get("name") == "aten::linear" for e in events)
    assert 0 < r["busy_s"] <= r["step_s"] and r["idle_s"] == pytest.approx(r["step_s"] - r["busy_s"])
    assert r["kernels_per_step"] > 0 and r["top_kernels"][0]["seconds_per_step"] > 0
    # 2 layers x (q, k, v, o, gate, up, down) + the LM head: 15 linear layers per forward
    linear = next(k for k in r["top_kernels"] if k["name"] == "aten::linear")
    assert linear["calls_per_step"] == 15


def test_a_failing_extra_part_is_recorded_and_keeps_what_came_before(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import json

    from calibration.device_check import measure_part

    path = tmp_path / "device_check.json"
    result: dict = {"measured_step_s": 0.5}

    def broken() -> dict:
        raise RuntimeError("CUPTI unavailable")

    assert measure_part(result, "real_step_trace", broken, path) is False
    assert measure_part(result, "shipped", lambda: {"predicted_step_s": 0.4}, path) is True
    on_disk = json.loads(path.read_text())
    assert on_disk == {"measured_step_s": 0.5, "real_step_trace": {"error": "RuntimeError: CUPTI unavailable"},
                       "shipped": {"predicted_step_s": 0.4}}
    assert "real_step_trace failed: RuntimeError: CUPTI unavailable" in capsys.readouterr().out
