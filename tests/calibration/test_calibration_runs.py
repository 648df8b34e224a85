"""The calibration suite itself, on this CPU: a quick run end to end, resume, a failing rank, OOM, CLI.

These runs use a tiny model and ``--quick`` (seconds each) and assert behaviour, not speed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from calibration.compute import Context, Measurement, PlanSettings, bench_gemm, compute_plan, run_plan  # noqa: E402
from calibration.journal import Journal  # noqa: E402
from calibration.shapes import Target, kernel_calls, read_run  # noqa: E402
from calibration.timing import DeviceTimer, OutOfMemory, TimerSettings  # noqa: E402
from simtrain.hardware.profile import load_profile  # noqa: E402

TINY = str(Path(__file__).parent / "data" / "tiny_llama.yaml")


def calibrate(out: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "simtrain.cli.main", "calibrate", "--device", "cpu", "--quick", "--config", TINY,
           "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _resumed_from(finished: tuple[Path, subprocess.CompletedProcess[str]], out: Path) -> Path:
    """``out``: a copy of the ``finished`` fixture's compute-only calibration, so a calibration into it resumes
    (its compute measurements are in the journal) and runs only its multi-process part (CI time: the quick
    compute part takes ~15 s of the ~23 s each of the two tests below took)."""
    root, first = finished
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.copytree(root / "calibrated" / "json-smoke", out)
    return out


def test_quick_calibration_with_gloo_collectives(tmp_path: Path,
                                                finished: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out = _resumed_from(finished, tmp_path / "quick")
    proc = calibrate(out, "--processes", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    prof = load_profile(str(out))
    assert prof.kind == "cpu" and prof.max_processes == 2 and 2 in prof.contention
    records = [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines()[1:]]
    clocks = {r["result"]["clock"] for r in records if r.get("kind") == "contention"}
    assert clocks == {"thread_cpu" if len(os.sched_getaffinity(0)) >= 2 else "wall"}
    (inter,) = [r["result"] for r in records if r.get("kind") == "interference"]
    assert inter["gemm_s"] > 0 and inter["gemm_with_comm_s"] > 0 and inter["slowdown"] >= 0
    assert ("all_reduce", 2, 1) in prof.collectives.curves and ("send", 2, 1) in prof.collectives.curves
    data = (out / "profile.yaml").read_text()
    assert "algbw_Bps" in data and "busbw_Bps" in data and "interference" in data and "layer_step" in data
    assert prof.compute.in_situ > 0.5
    sim = __import__("simtrain").simulate(TINY, [f"hardware.profile={out}", "layout.dp=2", "train.global_batch_seqs=4"])
    assert sim.step_time_s > 0


def test_interrupted_calibration_resumes(tmp_path: Path) -> None:
    out = tmp_path / "resume"
    cmd = [sys.executable, "-m", "calibration", "--device", "cpu", "--quick", "--config", TINY, "--out", str(out),
           "--no-collectives"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = out / "measurements.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not journal.exists() or len(journal.read_text().splitlines()) < 12):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # an interruption at an arbitrary point
    proc.wait()
    done = {r["key"] for r in journal_lines_tolerant(out)[1:]}  # the kill may have cut the last line
    assert len(done) >= 11
    with open(journal, "a") as fh:
        fh.write('{"key": "cut sho')  # a line cut short by the interruption
    again = calibrate(out, "--no-collectives")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming: {len(done)} of" in again.stdout
    keys = [r["key"] for r in journal_lines_tolerant(out)[1:]]
    assert len(keys) == len(set(keys))  # nothing measured twice
    assert load_profile(str(out)).compute.gemm is not None


def journal_lines_tolerant(folder: Path) -> list[dict[str, Any]]:
    out = []
    for line in (folder / "measurements.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def test_a_failing_rank_ends_the_run_with_a_clear_message(tmp_path: Path,
                                                          finished: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out = _resumed_from(finished, tmp_path / "fail")
    t0 = time.monotonic()
    proc = calibrate(out, "--processes", "2", env={"SIMTRAIN_CALIBRATION_FAIL_RANK": "1"})
    assert proc.returncode == 1
    assert "rank 1 of 2 failed" in proc.stderr and "injected failure" in proc.stderr
    assert time.monotonic() - t0 < 120  # stopped, not hung until a timeout


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One finished quick calibration (no collectives, the wall clock, ``--json``) by name into a
    $SIMTRAIN_PROFILES_DIR: (that folder, the command's outcome). The tests below read it or try to resume
    it; a refused resume writes nothing, so they can share it (one calibration, not three: CI time)."""
    root = tmp_path_factory.mktemp("profiles")
    proc = calibrate(Path("json-smoke"), "--no-collectives", "--json",
                     env={"SIMTRAIN_PROFILES_DIR": str(root)})
    return root, proc


def test_resuming_on_another_setup_is_refused(finished: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, first = finished
    assert first.returncode == 0, first.stderr[-3000:]
    out = root / "calibrated" / "json-smoke"
    proc = calibrate(out, "--no-collectives", "--threads", "2")
    assert proc.returncode == 2 and "--fresh" in proc.stderr


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "simtrain.cli.main", "calibrate", "--device", "cpu", "--out",
                           str(tmp_path / "x"), "--layout", "tp=two"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--layout" in proc.stderr and "Traceback" not in proc.stderr


def test_out_of_memory_is_recorded_and_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = DeviceTimer(torch.device("cpu"), TimerSettings(warmup=1, min_repeats=3, target_s=0.001))

    def boom() -> None:
        raise RuntimeError("CUDA out of memory. Tried to allocate 80.00 GiB")

    with pytest.raises(OutOfMemory):
        timer.measure(boom)
    import calibration.compute as compute

    def fake(ctx: Any, meas: Measurement, target: Any) -> Any:
        if meas.params.get("m") == 2:
            raise OutOfMemory("out of memory")
        return timer.measure(lambda: None), {}

    monkeypatch.setattr(compute, "run_measurement", fake)
    journal = Journal(tmp_path / "measurements.jsonl", {"fingerprint": "x", "device": {}})
    plan = [Measurement("gemm", {"role": "fwd", "m": m, "n": 1, "k": 1}) for m in (1, 2, 3)]
    counts = run_plan(Context(torch.device("cpu"), torch.float32, timer), plan, None, journal,  # type: ignore[arg-type]
                      lambda _: None)
    assert counts["ok"] == 2 and counts["oom"] == 1
    assert [r["status"] for r in journal.records()] == ["ok", "oom", "ok"]


def test_plan_uses_simtrains_kernel_shapes_and_bytes() -> None:
    run = read_run(TINY)
    target = Target(run.model, seq_len=run.train.seq_len, micro_batch_size=run.train.micro_batch_size)
    calls = kernel_calls(target)
    plan = compute_plan(target, PlanSettings.for_device("cpu", quick=True))
    at_target = {m.params["op"]: m.extra["sim_bytes"] for m in plan
                 if m.kind == "memory_op" and m.extra.get("at_target") and m.params.get("round") == 0}
    for op, nbytes in at_target.items():
        assert nbytes == pytest.approx(calls.memory_bytes[op])  # the x simtrain will ask the curve about
    gemms = {(m.params["kernel"], m.params["role"], m.params["m"], m.params["n"], m.params["k"]) for m in plan
             if m.kind == "gemm"}
    assert {("qkv", "fwd", 64, 128, 64), ("mlp_up", "fwd", 64, 256, 64), ("", "fwd", 64, 256, 64)} <= gemms


def test_composite_gemm_runs_the_stacks_linears() -> None:
    ctx = Context(torch.device("cpu"), torch.float32,
                  DeviceTimer(torch.device("cpu"), TimerSettings(warmup=1, min_repeats=3, target_s=0.001)))
    for role in ("fwd", "dgrad", "wgrad"):
        assert bench_gemm(ctx, role, 32, 48, 16, parts=[16, 16, 16] if role != "dgrad" else [8, 8]).median_s > 0


def test_device_check_dry_run(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "calibration.device_check", "--dry-run", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "device_check.json").read_text())
    assert res["measured_step_s"] > 0 and res["predicted_step_s"] > 0
    assert "predicted" in proc.stdout and (tmp_path / "profile" / "profile.yaml").is_file()
    # out of sample: the same step on the shipped H100 profile (rehearsed on the CPU), kernel by kernel
    shipped = res["shipped"]
    assert shipped["gpu"] == "h100-sxm" and shipped["predicted_step_s"] > 0 and "shipped profile" in proc.stdout
    kernels = {r["kernel"]: r for r in shipped["per_kernel"]}
    assert {"qkv", "mlp_up.dgrad", "optimizer.step"} <= set(kernels)
    assert all(r["calibrated_s"] > 0 and r["shipped_s"] > 0 for r in kernels.values())
    # the real step under torch.profiler, its Chrome trace beside the JSON
    assert res["real_step_trace"]["kernels_per_step"] > 0 and (tmp_path / "real_step_trace.json.gz").is_file()
    # then the sustained GEMM, written into the same file
    gemm = res["sustained_gemm"]
    assert gemm["n"] == 128 and len(gemm["windows"]) >= 2 and gemm["sustained_tflops"] > 0 and gemm["shipped_tflops"] > 0


def test_measure_keeps_a_result_written_before_a_rank_died_in_teardown(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A DDP rank that aborts while the process group is torn down, after rank 0 wrote the timed
    result, does not throw the measurement away; a rank dying before the result exists still fails."""
    from calibration import compare
    from calibration.launch import RankFailed

    def teardown_abort(args: list[str], *a: Any, **k: Any) -> None:
        out = Path(args[args.index("--out") + 1])
        out.write_text(json.dumps({"implementation": "eager", "step_times_s": [0.5], "median_s": 0.5}))
        raise RankFailed("rank 0 of 2 failed (exit code -6)")

    monkeypatch.setattr(compare, "launch_local", teardown_abort)
    assert compare.measure(TINY, 2, 1, 0, 1, tmp_path)["median_s"] == 0.5

    def early_abort(args: list[str], *a: Any, **k: Any) -> None:
        raise RankFailed("rank 1 of 2 failed (exit code 1)")

    monkeypatch.setattr(compare, "launch_local", early_abort)
    with pytest.raises(RankFailed):  # the earlier result file is removed before the launch
        compare.measure(TINY, 2, 1, 0, 1, tmp_path)


def test_json_summary_is_quiet_and_names_go_to_the_user_dir(finished: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """``--out NAME`` writes under $SIMTRAIN_PROFILES_DIR/calibrated/NAME (never into the checkout), and
    ``--json`` prints one JSON object to stdout and no progress or log."""
    tmp_path, proc = finished
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == ""
    summary = json.loads(proc.stdout)
    profile = tmp_path / "calibrated" / "json-smoke" / "profile.yaml"
    assert summary["profile"] == str(profile) and summary["name"] == "json-smoke" and summary["quick"] is True
    assert profile.is_file() and (profile.parent / "measurements.jsonl").is_file()
    assert summary["compute"]["ok"] > 0 and summary["compute"]["error"] == 0
    assert not Path("json-smoke").exists()
    env = {**os.environ, "SIMTRAIN_PROFILES_DIR": str(tmp_path)}
    sim = subprocess.run([sys.executable, "-m", "simtrain.cli.main", "simulate", TINY, "--set", "hardware.profile=json-smoke",
                          "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert sim.returncode == 0 and json.loads(sim.stdout)["step_time_s"] > 0, sim.stderr[-2000:]


def test_a_builtin_profile_name_is_refused_as_output(tmp_path: Path) -> None:
    proc = calibrate(Path("example-cpu"), "--no-collectives", env={"SIMTRAIN_PROFILES_DIR": str(tmp_path)})
    assert proc.returncode == 2 and "--out: 'example-cpu' is not valid" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "calibrated").exists()


def test_progress_bar_with_eta_on_a_terminal_only() -> None:
    import io

    from rich.console import Console

    from calibration.progress import CalibrationProgress

    out = io.StringIO()
    shown = CalibrationProgress(True, Console(file=out, force_terminal=True, width=100))
    with shown.running():
        phase = shown.phase("single-device kernels", 3)
        for _ in range(3):
            phase.advance()
    assert shown.active and "single-device kernels" in out.getvalue() and "3/3" in out.getvalue()
    assert "ETA" in out.getvalue()
    piped = io.StringIO()
    hidden = CalibrationProgress(True, Console(file=piped, force_terminal=False))
    with hidden.running():
        hidden.phase("x", 2).advance()
    assert not hidden.active and piped.getvalue() == ""
    assert not CalibrationProgress.for_cli(json_output=True).active


def test_a_window_missed_under_load_still_times_once() -> None:
    """A contention window that passed before this rank ran again timed nothing (NaN); now it times once."""
    from calibration.collectives import Ctx, _windowed

    calls: list[int] = []
    t = _windowed(lambda: calls.append(1), Ctx(torch.device("cpu"), 0, 1), time.time() - 1.0)
    assert len(calls) == 1 and t == t and t >= 0
    untimed = _windowed(lambda: None, Ctx(torch.device("cpu"), 0, 1), time.time() + 5, during=lambda: False)
    assert untimed != untimed  # beside a collective that already ended nothing is timed (NaN, as before)


def test_contention_is_timed_by_thread_cpu_only_when_each_rank_has_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rank on a core of its own, a descheduled thread waits for a process outside the run: the thread's CPU
    time. More ranks than cores (they take turns: the run's own contention), several threads per rank (the
    thread's CPU time holds one of them) or a GPU: the wall clock."""
    from calibration import collectives
    from calibration.collectives import Ctx, contention_clock
    from calibration.timing import Clock

    cpu = torch.device("cpu")
    monkeypatch.setattr(collectives.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(collectives.torch, "get_num_threads", lambda: 1)
    assert contention_clock(Ctx(cpu, 0, 2)) is Clock.THREAD_CPU
    assert contention_clock(Ctx(cpu, 0, 4)) is Clock.WALL
    assert contention_clock(Ctx(torch.device("cuda"), 0, 2)) is Clock.WALL
    monkeypatch.setattr(collectives.torch, "get_num_threads", lambda: 2)
    assert contention_clock(Ctx(cpu, 0, 2)) is Clock.WALL


def test_a_contention_pair_by_thread_cpu_leaves_out_descheduled_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0's windows (one rank: no peer to wait for, the broadcast of the windows' instants is its own): a
    kernel that sleeps 20 ms, as a thread does while another process holds its core, reads >= 20 ms on the wall
    clock and ~0 by the thread's CPU time, in both windows."""
    from calibration import collectives
    from calibration.collectives import Ctx, _contention_pair
    from calibration.timing import Clock

    monkeypatch.setattr(collectives.dist, "broadcast_object_list", lambda objects, src: None)
    ctx = Ctx(torch.device("cpu"), 0, 1)

    def nap() -> None:
        time.sleep(0.02)

    wall = _contention_pair(ctx, nap, nap, 0.06, Clock.WALL)
    cpu = _contention_pair(ctx, nap, nap, 0.06, Clock.THREAD_CPU)
    assert min(wall) >= 0.02 and max(cpu) < 0.005


def test_a_window_can_be_summarised_by_its_mean() -> None:
    """Beside a collective the GEMMs' mean time is the compute's rate (a thread taking turns with gloo's makes
    some calls long and leaves others alone, which a median would not see)."""
    from calibration.collectives import Ctx, _windowed

    naps = iter([0.0, 0.0, 0.03] * 10)
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        time.sleep(next(naps))

    mean = _windowed(fn, Ctx(torch.device("cpu"), 0, 1), time.time() + 5, during=lambda: len(calls) < 3,
                     reduce=statistics.fmean)
    assert len(calls) == 3 and 0.01 <= mean < 0.02


def test_thread_cpu_clock_leaves_out_the_time_the_thread_did_not_run() -> None:
    """``Clock.THREAD_CPU`` times a benchmark by the calling thread's CPU time: a call that sleeps 50 ms
    (as a process does while the scheduler runs others on its core) reads ~0 on it and >= 50 ms on the
    wall clock."""
    from calibration.timing import Clock

    def nap() -> None:
        time.sleep(0.05)

    settings = dict(warmup=1, min_repeats=3, max_repeats=3, target_s=0.0)
    wall = DeviceTimer(torch.device("cpu"), TimerSettings(**settings)).measure(nap)  # type: ignore[arg-type]
    cpu = DeviceTimer(torch.device("cpu"), TimerSettings(**settings, clock=Clock.THREAD_CPU)).measure(nap)  # type: ignore[arg-type]
    assert wall.median_s >= 0.05 and cpu.median_s < 0.01
    assert TimerSettings(clock=Clock.THREAD_CPU).to_dict()["clock"] == "thread_cpu"


def test_resuming_with_another_clock_is_refused(finished: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """One profile, one clock: its kernel times are summed into one step."""
    root, first = finished
    assert first.returncode == 0, first.stderr[-3000:]
    out = root / "calibrated" / "json-smoke"
    assert '"clock": "wall"' in (out / "measurements.jsonl").read_text().splitlines()[0]
    proc = calibrate(out, "--no-collectives", "--clock", "thread_cpu")
    assert proc.returncode == 2 and "--clock" in proc.stderr and "Traceback" not in proc.stderr


def test_cpu_plan_times_the_optimizer_after_a_training_step() -> None:
    """On a CPU the optimizer is timed right after a forward and backward of a model with the target's
    parameters (the allocator state a training loop leaves it in); GPU plans time it alone as before."""
    from calibration.compute import bench_optimizer_after_step, optimizer_in_situ
    from calibration.shapes import param_shapes

    run = read_run(TINY)
    target = Target(run.model, seq_len=run.train.seq_len, micro_batch_size=run.train.micro_batch_size)
    cpu = [m for m in compute_plan(target, PlanSettings.for_device("cpu", quick=True)) if m.kind == "optimizer"]
    gpu = [m for m in compute_plan(target, PlanSettings.for_device("cuda", quick=True)) if m.kind == "optimizer"]
    assert cpu and all(m.params["after_step"] for m in cpu)
    assert gpu and not any("after_step" in m.params for m in gpu)
    assert optimizer_in_situ(target) and not optimizer_in_situ(Target(run.model, tp=2))
    ctx = Context(torch.device("cpu"), torch.float32,
                  DeviceTimer(torch.device("cpu"), TimerSettings(warmup=1, min_repeats=3, target_s=0.001)))
    assert bench_optimizer_after_step(ctx, target, 1).median_s > 0
    # the model it steps holds exactly the parameters the optimizer benchmark (and simtrain) count
    from calibration.ops import EagerLlama

    m = run.model
    model = EagerLlama(m.vocab, m.hidden, 2, m.n_heads, m.kv_heads, m.ffn_hidden, m.d_head)
    assert sorted(tuple(p.shape) for p in model.parameters()) == sorted(param_shapes(m, 1, 2))


def test_cpu_plan_times_the_head_loss_and_optimizer_inside_training_steps() -> None:
    """On a CPU the LM head, the loss, the embedding and the optimizer of the whole model are timed inside
    training steps of a model with the target's dimensions, in a new process (the allocator state of a
    training process, ``calibration.instep_measure``); GPU plans and targets ``EagerLlama`` does not
    run (TP shards) do without it."""
    from calibration.instep import IN_STEP_GEMMS, IN_STEP_MEMORY_OPS, in_step_applies
    from calibration.instep_measure import QUICK_IN_STEP_STEPS, STEPS, in_fresh_process
    from calibration.timing import Clock
    from calibration.writer import MIN_JITTER_STEPS

    run = read_run(TINY)
    target = Target(run.model, seq_len=run.train.seq_len, micro_batch_size=run.train.micro_batch_size)
    cpu = compute_plan(target, PlanSettings.for_device("cpu", quick=True))
    gpu = compute_plan(target, PlanSettings.for_device("cuda", quick=True))
    assert [m.kind for m in cpu].count("in_step") == 1 and "in_step" not in [m.kind for m in gpu]
    # --quick times 5 steps in its one round (no step jitter: calibration.writer.MIN_JITTER_STEPS); a full CPU
    # calibration 11 in each of three rounds, 33 whole steps behind summary.step_jitter
    full = compute_plan(target, PlanSettings.for_device("cpu"))
    assert [m.extra["steps"] for m in cpu if m.kind == "in_step"] == [QUICK_IN_STEP_STEPS]
    assert [m.extra["steps"] for m in full if m.kind == "in_step"] == [STEPS] * 3
    assert QUICK_IN_STEP_STEPS < MIN_JITTER_STEPS <= 3 * STEPS
    # the whole model's optimizer comes from the in-step measurement, not a second after-step benchmark
    assert [m.params["layers"] for m in cpu if m.kind == "optimizer"] == [1]
    assert in_step_applies(target) and not in_step_applies(Target(run.model, tp=2))
    measured = in_fresh_process(target, "fp32", Clock.THREAD_CPU, 1)
    kernels = measured["kernels"]
    assert set(kernels) == set(IN_STEP_GEMMS) | set(IN_STEP_MEMORY_OPS)
    assert all(k["median_s"] > 0 and k["repeats"] == STEPS for k in kernels.values())
    # the whole steps (their spread is summary.step_jitter), each longer than the kernels timed inside it
    assert len(measured["step_s"]) == STEPS and min(measured["step_s"]) > sum(k["min_s"] for k in kernels.values())
