"""GPU check: calibrate one H100/H200, run a real BF16 training step of a ~1B Llama, compare with simtrain.

    bash calibration/device_check.sh              # on a machine with one H100/H200 (under 8 minutes)
    python -m calibration.device_check --dry-run  # the same steps on this CPU with a tiny model (tests)

Steps: (1) ``simtrain calibrate --device cuda`` for the 1B model's exact shapes (compute and memory;
one GPU, so no collectives), into ``<out>/profile`` (a profile folder); (2) a real training step of
transformers' ``LlamaForCausalLM`` (Llama-3.2-1B dimensions, randomly initialised, BF16 weights,
SDPA attention, AdamW) timed over several steps with its peak memory; (3) simtrain's prediction of
that step on the calibrated machine (``hardware.node: calibrated``); then the comparison is printed
and written as JSON; before it, two more real steps under torch.profiler (``calibration.step_trace``: the
Chrome trace, the device's busy and idle time); (4) the same step on simtrain's shipped profile of the GPU, with each kernel's time
under it beside the calibration's (``calibration.device_compare``: the out-of-sample prediction); (5) a
sustained GEMM, its rate over time against the first window's (``calibration.sustained``). nvidia-smi's
clocks, power and temperature are sampled throughout. Output goes under ``$OUT`` when it is set (else
``./device_check_out``).

Known accounting differences printed with the memory numbers: the real step keeps BF16 AdamW
moments (4 bytes/param) while simtrain's default accounting is Megatron's fp32 master weights and
moments (12 bytes/param); eager HF activations follow the ``eager_hf`` stack of ``simtrain.lower.memory``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from calibration.device_compare import per_kernel, shipped_gemm_tflops, shipped_hardware
from calibration.step_trace import trace_steps
from calibration.sustained import SmiSampler, sustained_gemm
from simtrain.engine.trace import write_atomic
from simtrain.spec.model import ModelSpec

#: Llama 3.2 1B dimensions (meta-llama/Llama-3.2-1B config.json: hidden 2048, 16 layers, 32 heads,
#: 8 KV heads, FFN 8192, vocab 128256, tied embeddings): 1.24B parameters.
LLAMA_1B = ModelSpec(name="llama3.2-1b", n_layers=16, hidden=2048, n_heads=32, n_kv_heads=8, ffn_hidden=8192,
                     activation="swiglu", norm="rmsnorm", position="rope", vocab=128256, max_position=131072,
                     tied_embeddings=True, linear_bias=False)
TINY = ModelSpec(name="llama-tiny", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn_hidden=384,
                 activation="swiglu", norm="rmsnorm", position="rope", vocab=512, max_position=512,
                 tied_embeddings=False, linear_bias=False)


def run_config(model: ModelSpec, seq_len: int, micro_batch_size: int, profile: str) -> dict[str, Any]:
    """The simtrain run config of the checked step: one device, one micro-batch, AdamW, BF16 gradients."""
    return {"name": f"device-check-{model.name}", "model": model.model_dump(mode="json"),
            "hardware": {"profile": profile, "node": "calibrated"} if profile else {},
            "layout": {"dp": 1},
            "train": {"seq_len": seq_len, "micro_batch_size": micro_batch_size, "global_batch_seqs": micro_batch_size,
                      "optimizer": "adamw", "grad_dtype": "bf16", "stack": "pytorch-eager"}}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m calibration.device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="run every step on this CPU with a tiny model")
    p.add_argument("--out", help="output folder (default: $OUT, else ./device_check_out)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--fresh", action="store_true", help="recalibrate from scratch")
    p.add_argument("--sustained-s", type=float, default=30.0,
                   help="seconds of the sustained-GEMM test after the comparison (0: skip; dry run: 1 s)")
    p.add_argument("--sustained-n", type=int, default=8192, help="its GEMM size n (n x n x n; dry run: 128)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Calibrate, measure, predict, compare; returns the exit status."""
    args = _parser().parse_args(argv)
    with SmiSampler() as sampler:  # no samples without nvidia-smi (the dry run)
        return _check(args, sampler)


def _check(args: argparse.Namespace, sampler: SmiSampler) -> int:
    """``main`` with nvidia-smi's clocks sampled throughout."""
    import torch

    from calibration.cli import calibrate
    from calibration.cli import parser as calibrate_parser
    from calibration.realstep import train_steps
    from simtrain import simulate

    out = Path(args.out or os.environ.get("OUT") or "device_check_out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    dry = args.dry_run or not torch.cuda.is_available()
    if dry and not args.dry_run:
        print("device_check: no CUDA device; running the CPU dry run", flush=True)
    model, seq, mbs = (TINY, 64, 2) if dry else (LLAMA_1B, args.seq_len, args.micro_batch_size)
    device = "cpu" if dry else "cuda"
    t0, t_wall0 = time.perf_counter(), time.time()
    cfg_path = out / "run.yaml"
    write_atomic(cfg_path, yaml.safe_dump(run_config(model, seq, mbs, ""), sort_keys=False))
    cal_args = ["--device", device, "--config", str(cfg_path), "--out", str(out / "profile"), "--no-collectives"]
    calibrate(calibrate_parser().parse_args(cal_args + (["--quick"] if dry else []) + (["--fresh"] if args.fresh
                                                                                     else [])),
              log=lambda m: print(f"  {m}", flush=True))
    t_cal = time.perf_counter() - t0
    if not dry:
        torch.cuda.empty_cache()
    real = train_steps(model, seq, mbs, 3 if dry else args.steps, 1 if dry else args.warmup, torch.device(device),
                       torch.float32 if dry else torch.bfloat16)
    t_real = time.time()
    calibrated_cfg = run_config(model, seq, mbs, str(out / "profile"))
    pred = simulate(calibrated_cfg)
    result = _report(model, seq, mbs, real, pred, t_cal, time.perf_counter() - t0, device)
    result["clocks"] = {"calibration": sampler.between(t_wall0, t_wall0 + t_cal),
                        "real_step": sampler.between(t_wall0 + t_cal, t_real)}
    write_atomic(out / "device_check.json", json.dumps(result, indent=2))  # the costly part is safe from here on
    dtype = torch.float32 if dry else torch.bfloat16
    ok: list[bool] = []

    def part(key: str, fn: Callable[[], dict[str, Any]]) -> None:
        ok.append(measure_part(result, key, fn, out / "device_check.json"))

    if not dry:
        torch.cuda.empty_cache()
    # the real step from inside: a torch.profiler trace of two more steps, the device's busy and idle time
    part("real_step_trace", lambda: trace_steps(model, seq, mbs, torch.device(device), dtype, out / "real_step_trace"))
    # out of sample: the same step on the shipped profile of this GPU (a dry run rehearses it on the H100's)
    name = "NVIDIA H100 80GB HBM3" if dry else torch.cuda.get_device_name(0)
    hardware, note = shipped_hardware(name)

    def shipped() -> dict[str, Any]:
        shipped_cfg = {**run_config(model, seq, mbs, ""), "hardware": hardware}
        step = simulate(shipped_cfg).step_time_s
        return {"device_name": name, "gpu": hardware["gpu"], "note": note, "predicted_step_s": step,
                "step_error": step / real["median_s"] - 1.0, "per_kernel": per_kernel(calibrated_cfg, shipped_cfg)}

    part("shipped", shipped)
    _print(result, out)
    seconds = min(args.sustained_s, 1.0) if dry else args.sustained_s
    if seconds > 0:  # last, so a time limit that ends it keeps everything above

        def gemm() -> dict[str, Any]:
            n = 128 if dry else args.sustained_n
            g = sustained_gemm(torch.device(device), dtype, n, seconds, window_s=0.1 if dry else 0.5, sampler=sampler)
            g["shipped_tflops"] = shipped_gemm_tflops(hardware["gpu"], n)
            return g

        part("sustained_gemm", gemm)
        if "error" not in result["sustained_gemm"]:
            _print_sustained(result["sustained_gemm"])
    return 0 if all(ok) else 1


def measure_part(result: dict[str, Any], key: str, fn: Callable[[], dict[str, Any]], path: Path) -> bool:
    """One measurement after the comparison: ``result[key] = fn()``, then ``result`` written to ``path`` at once.
    A failure is recorded under ``key`` (``{"error": ...}``) and printed instead of raised, so it cannot lose what
    was measured before it (the calibration and the real step); returns whether ``fn`` succeeded."""
    try:
        result[key] = fn()
        done = True
    except Exception as exc:  # noqa: BLE001 - any failure of an extra part is reported, not raised
        result[key] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  {key} failed: {type(exc).__name__}: {exc}", flush=True)
        done = False
    write_atomic(path, json.dumps(result, indent=2))
    return done


def _report(model: ModelSpec, seq: int, mbs: int, real: dict[str, Any], pred: Any, t_cal: float, t_all: float,
            device: str) -> dict[str, Any]:
    mem = pred.memory[0]
    res = {"device": device, "model": model.name, "params": real["params"], "seq_len": seq, "micro_batch_size": mbs,
           "implementation": real["implementation"], "measured_step_s": real["median_s"],
           "measured_steps_s": real["step_times_s"], "predicted_step_s": pred.step_time_s,
           "step_error": pred.step_time_s / real["median_s"] - 1.0, "predicted_peak_bytes": mem.peak_bytes,
           "predicted_memory_components_bytes": mem.components, "calibration_s": t_cal, "total_s": t_all}
    if "peak_allocated_bytes" in real:
        res["measured_peak_allocated_bytes"] = real["peak_allocated_bytes"]
        res["measured_peak_reserved_bytes"] = real["peak_reserved_bytes"]
        res["peak_error"] = mem.peak_bytes / real["peak_reserved_bytes"] - 1.0
    return res


def _print(r: dict[str, Any], out: Path) -> None:
    gib = 1024.0**3
    print(f"device_check ({r['device']}): {r['model']} ({r['params'] / 1e9:.2f}B params, {r['implementation']}), "
          f"s={r['seq_len']} b={r['micro_batch_size']}")
    print(f"  step time: measured {r['measured_step_s']:.4f} s (median), predicted {r['predicted_step_s']:.4f} s, "
          f"error {100 * r['step_error']:+.1f} %")
    if "measured_peak_reserved_bytes" in r:
        print(f"  peak memory: measured {r['measured_peak_allocated_bytes'] / gib:.2f} GiB allocated, "
              f"{r['measured_peak_reserved_bytes'] / gib:.2f} GiB reserved; predicted {r['predicted_peak_bytes'] / gib:.2f} "
              f"GiB (error vs reserved {100 * r['peak_error']:+.1f} %; simtrain counts fp32 Adam state, the real "
              "step keeps bf16 moments)")
    if "shipped" in r and "error" not in r["shipped"]:
        sh = r["shipped"]
        print(f"  shipped profile {sh['gpu']} (not calibrated): predicted {sh['predicted_step_s']:.4f} s, error "
              f"{100 * sh['step_error']:+.1f} %" + (f" ({sh['note']})" if sh["note"] else ""))
        print("  kernels, seconds per step: calibrated (measured here) vs shipped; the ten longest:")
        for row in sh["per_kernel"][:10]:
            ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "-"
            print(f"    {row['kernel']:<28} {row['calibrated_s']:.5f}  {row['shipped_s']:.5f}  {ratio}")
    if (tr := r.get("real_step_trace")) and "error" not in tr:
        print(f"  real step under torch.profiler: {tr['step_s']:.4f} s, device busy {tr['busy_s']:.4f} s "
              f"({100 * tr['idle_fraction']:.1f} % idle), {tr['kernels_per_step']:.0f} kernels per step; trace "
              f"{tr['trace']}")
        for k in tr["top_kernels"][:5]:
            print(f"    {k['seconds_per_step']:.5f} s  x{k['calls_per_step']:.0f}  {k['name'][:70]}")
    for phase, c in (r.get("clocks") or {}).items():
        if c:
            print(f"  {phase}: {_clocks_text(c)} (median)")
    print(f"  calibration {r['calibration_s']:.0f} s, total {r['total_s']:.0f} s; results in {out}")


def _print_sustained(g: dict[str, Any]) -> None:
    print(f"  sustained GEMM {g['n']}^3 {g['dtype']}, {g['seconds']:.0f} s back to back: first window "
          f"{g['burst_tflops']:.1f} TFLOP/s, last quarter {g['sustained_tflops']:.1f} (x{g['ratio']:.3f}), "
          f"shipped profile {g['shipped_tflops']:.1f}")
    for label in ("burst_clocks", "sustained_clocks"):
        if c := g.get(label):
            print(f"    {label.split('_')[0]}: {_clocks_text(c)}")


def _clocks_text(c: dict[str, float]) -> str:
    """The fields nvidia-smi reported, e.g. "SM 1755 MHz, 690 W, 71 C"."""
    units = (("sm_mhz", "SM {:.0f} MHz"), ("power_w", "{:.0f} W"), ("temp_c", "{:.0f} C"))
    return ", ".join(fmt.format(c[key]) for key, fmt in units if key in c)


if __name__ == "__main__":
    sys.exit(main())
