"""The real pipelined step (calibration.realstep_pp) and its comparison with simtrain (calibration.compare_pp).

The stages must be the model simtrain simulates, cut where simtrain cuts it: chained, they compute
transformers' own ``LlamaForCausalLM`` logits and loss; their parameters partition the model's, stage by
stage as simtrain's per-stage weights; and the step runs for real under torch's pipeline schedules over
gloo. The timing comparison itself (calibrate, measure, compare) is ``benchmarks/cpu_pp_loop.py``'s, whose
last table is ``benchmarks/results/cpu_pp_loop.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from calibration import compare_pp  # noqa: E402
from calibration.compare_pp import PipelineCase, measure_pp  # noqa: E402
from calibration.realstep import build_model  # noqa: E402
from calibration.realstep_pp import LlamaStage, chunk_layers, stage_layers  # noqa: E402
from calibration.shapes import read_run  # noqa: E402
from simtrain import simulate  # noqa: E402
from simtrain.lower.layer_plan import split_layers  # noqa: E402

DATA = Path(__file__).parent / "data"
TINY = str(DATA / "tiny_llama.yaml")


def _stages(n_layers: int, stages: int) -> tuple[Any, list[LlamaStage]]:
    spec = read_run(TINY).model.model_copy(update={"n_layers": n_layers})
    torch.manual_seed(0)
    full, impl = build_model(spec, torch.float32, torch.device("cpu"))
    assert impl == "transformers.LlamaForCausalLM"
    ranges = stage_layers(n_layers, stages)
    return full, [LlamaStage(full, r, s == 0, s == stages - 1) for s, r in enumerate(ranges)]


@pytest.mark.parametrize("n_layers, stages", [(2, 2), (5, 2), (7, 3)])
def test_chained_stages_compute_the_models_logits_and_loss(n_layers: int, stages: int) -> None:
    full, parts = _stages(n_layers, stages)
    ids = torch.randint(0, full.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    x = ids
    with torch.no_grad():
        for part in parts:
            x = part(x)
        ref = full(input_ids=ids, labels=ids)
        loss = full.loss_function(logits=x, labels=ids, vocab_size=full.config.vocab_size)
    assert torch.allclose(x, ref.logits, rtol=1e-5, atol=1e-6)
    assert float(loss) == pytest.approx(float(ref.loss), rel=1e-6)


@pytest.mark.parametrize("n_layers, stages", [(2, 2), (5, 2), (7, 3)])
def test_stage_parameters_partition_the_model_as_simtrain_splits_it(n_layers: int, stages: int) -> None:
    """Each parameter on exactly one stage; each stage's count in the same proportion to simtrain's
    per-stage weight bytes as the whole model's count to simtrain's weights without pipelining."""
    full, parts = _stages(n_layers, stages)
    ids = [{id(p) for p in part.parameters()} for part in parts]
    assert sum(len(s) for s in ids) == len(set().union(*ids)) == len(list(full.parameters()))
    counts = [sum(p.numel() for p in part.parameters()) for part in parts]
    base = [f"model.n_layers={n_layers}"]  # weights do not depend on the hardware: one H100 per stage here
    whole = simulate(TINY, [*base, "hardware.gpus_per_node=1"]).memory[0].components["weights"]
    bytes_per_param = whole / sum(p.numel() for p in full.parameters())
    piped = simulate(TINY, [*base, f"hardware.gpus_per_node={stages}", f"layout.pp={stages}",
                            f"train.global_batch_seqs={2 * stages}"]).memory
    assert [m.components["weights"] / bytes_per_param for m in piped] == pytest.approx(counts, rel=1e-9)


def test_stage_layers_follow_simtrains_layout() -> None:
    assert stage_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert stage_layers(5, 2) == [range(0, 2), range(2, 5)]  # the last stage also holds the LM head
    assert [len(r) for r in stage_layers(126, 16)] == [7] + [8] * 14 + [7]


@pytest.mark.parametrize("n_layers, stages, chunks", [(4, 2, 2), (10, 2, 2), (12, 3, 2), (12, 2, 3)])
def test_interleaved_chunks_sit_where_simtrains_virtual_stages_put_them(n_layers: int, stages: int,
                                                                        chunks: int) -> None:
    """Chunk c of rank r is model stage c * p + r (Megatron's virtual stages); the model stages' layers are
    consecutive in path order, cover the model once, and count what simtrain's split gives each chunk."""
    plan = chunk_layers(n_layers, stages, chunks, "interleaved_1f1b")
    assert [[k for k, _ in rank] for rank in plan] == [[c * stages + r for c in range(chunks)] for r in range(stages)]
    by_position = sorted((k, r) for rank in plan for k, r in rank)
    layers = [i for _, r in by_position for i in r]
    assert layers == list(range(n_layers))
    assert [[len(r) for _, r in rank] for rank in plan] == split_layers(n_layers, stages, chunks)


def test_interleaved_chunks_chained_in_path_order_compute_the_models_logits() -> None:
    spec = read_run(TINY).model.model_copy(update={"n_layers": 6})
    torch.manual_seed(0)
    full, _ = build_model(spec, torch.float32, torch.device("cpu"))
    plan = chunk_layers(6, 2, 2, "interleaved_1f1b")
    parts = [LlamaStage(full, r, k == 0, k == 3) for k, r in sorted(kr for rank in plan for kr in rank)]
    ids = torch.randint(0, full.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    x = ids
    with torch.no_grad():
        for part in parts:
            x = part(x)
        ref = full(input_ids=ids)
    assert torch.allclose(x, ref.logits, rtol=1e-5, atol=1e-6)


def test_an_interleaved_case_simulates_its_chunks_and_refuses_chunks_elsewhere() -> None:
    assert PipelineCase(2, 4, "interleaved_1f1b", 2).overrides(2) == [
        "layout.dp=1", "layout.pp=2", "layout.vpp=2", "layout.schedule=interleaved_1f1b", "train.global_batch_seqs=8"]
    assert PipelineCase(2, 4, "interleaved_1f1b", 2).label == "pp2 v2 interleaved_1f1b x4"
    with pytest.raises(ValueError, match="chunks=2: 1f1b runs 1 per rank"):
        PipelineCase(2, 4, "1f1b", 2)
    # DualPipeV: two chunks in a V that simtrain's schedule places itself (layout.vpp 1)
    assert PipelineCase(2, 4, "dualpipev", 2).overrides(2)[2:4] == ["layout.vpp=1", "layout.schedule=dualpipev"]
    with pytest.raises(ValueError, match="chunks=3: dualpipev runs 2 per rank"):
        PipelineCase(2, 4, "dualpipev", 3)


@pytest.mark.parametrize("n_layers, stages", [(4, 2), (10, 2), (12, 3)])
def test_dualpipev_chunks_sit_in_simtrains_v(n_layers: int, stages: int) -> None:
    """Rank r holds model stages r and 2p - 1 - r (deepseek-ai/DualPipe's V, torch's ``style="v"``), each
    with the layers simtrain's dualpipev split gives it, in path order."""
    plan = chunk_layers(n_layers, stages, 2, "dualpipev")
    assert [[k for k, _ in rank] for rank in plan] == [[r, 2 * stages - 1 - r] for r in range(stages)]
    by_position = sorted((k, r) for rank in plan for k, r in rank)
    assert [i for _, r in by_position for i in r] == list(range(n_layers))
    run = simulate(TINY, [f"model.n_layers={n_layers}", f"hardware.gpus_per_node={stages}", f"layout.pp={stages}",
                          "layout.schedule=dualpipev", f"train.global_batch_seqs={4 * stages}"])
    assert run.layout["schedule"] == "dualpipev"


@pytest.mark.parametrize("schedule, microbatches, name", [("interleaved_1f1b", 2, "ScheduleInterleaved1F1B"),
                                                         ("dualpipev", 4, "ScheduleDualPipeV")])
def test_real_chunked_step_runs_two_chunks_on_each_of_two_ranks(tmp_path: Path, schedule: str, microbatches: int,
                                                                name: str) -> None:
    config = tmp_path / "tiny4.yaml"
    config.write_text(Path(TINY).read_text().replace("n_layers: 2", "n_layers: 4"))
    case = PipelineCase(2, microbatches, schedule, 2)
    res = measure_pp(str(config), case, steps=2, warmup=1, threads=1, workdir=tmp_path, timeout_s=120)
    assert res["implementation"].endswith(f"({name})")
    assert res["chunks"] == 2 and res["layers_per_chunk"] == [[1, 1], [1, 1]] and res["layers_per_stage"] == [2, 2]
    assert len(res["step_times_s"]) == 2 and all(t > 0 for t in res["step_times_s"])
    # simtrain simulates the same case on this config
    run = simulate(str(config), [*case.overrides(2), "hardware.gpus_per_node=2"])
    assert run.layout["schedule"] == schedule and run.step_time_s > 0


def test_every_schedule_maps_to_torchs_class_and_simtrains_schedule_of_one_name() -> None:
    from torch.distributed import pipelining

    from calibration.realstep_pp import SCHEDULES
    from simtrain.plan.schedules import schedule_of

    for name, cls in SCHEDULES.items():
        assert isinstance(getattr(pipelining, cls), type) and schedule_of(name).kind == name


# GPipe runs the same single-chunk path as 1F1B with another class (the test above): one real run covers both
@pytest.mark.parametrize("schedule", ["1f1b"])
def test_real_pipelined_step_runs_on_two_ranks(tmp_path: Path, schedule: str) -> None:
    case = PipelineCase(2, 2, schedule)
    res = measure_pp(TINY, case, steps=2, warmup=1, threads=1, workdir=tmp_path, timeout_s=120)
    name = "Schedule1F1B" if schedule == "1f1b" else "ScheduleGPipe"
    assert res["implementation"] == f"transformers.LlamaForCausalLM split by torch.distributed.pipelining ({name})"
    assert res["stages"] == 2 and res["microbatches"] == 2 and res["layers_per_stage"] == [1, 1]
    assert len(res["step_times_s"]) == 2 and all(t > 0 for t in res["step_times_s"])
    assert 0.0 <= res["steal_fraction"] <= 1.0
    # each rank's step splits into its waits for transfers and its own work, neither longer than the step
    step = max(res["step_times_s"])
    for w, b in zip(res["wait_s_per_rank"], res["busy_s_per_rank"], strict=True):
        assert 0.0 <= w < step and 0.0 < b <= step


def test_compare_pp_pools_the_batches_and_simulates_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_simulate(config: str, overrides: list[str], trace: bool) -> Any:
        seen.append(overrides)
        ev = type("E", (), {})
        events = []
        for rank, stream, start, end in [(0, "compute", 0.0, 1.0), (0, "pp", 1.0, 1.5), (1, "compute", 0.5, 2.5),
                                         (1, "compute", 2.5, 3.0)]:
            e = ev()
            e.rank, e.stream, e.start_s, e.end_s = rank, stream, start, end
            events.append(e)
        return type("R", (), {"step_time_s": 3.0, "trace": events})()

    monkeypatch.setattr(compare_pp, "simulate", fake_simulate)
    batches = [{"step_times_s": [1.0, 2.0], "implementation": "x", "busy_s_per_rank": [0.5, 1.5]},
               {"step_times_s": [4.0], "implementation": "x", "busy_s_per_rank": [0.7, 1.9]}]
    c = compare_pp.compare_pp(TINY, "prof", PipelineCase(2, 4, "gpipe"), batches)
    assert c.measured_s == (1.0, 2.0, 4.0) and c.measured_median_s == 2.0 and c.error == pytest.approx(0.5)
    assert c.busy_measured_s == pytest.approx((0.6, 1.7)) and c.busy_predicted_s == (1.0, 2.5)
    assert seen == [["layout.dp=1", "layout.pp=2", "layout.vpp=1", "layout.schedule=gpipe", "train.global_batch_seqs=8",
                     "hardware.profile=prof"]]


def test_an_unknown_schedule_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'zb'.*1f1b, gpipe, interleaved_1f1b, dualpipev"):
        measure_pp(TINY, PipelineCase(2, 2, "zb"), 1, 1, 1, tmp_path)
