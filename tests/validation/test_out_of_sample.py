"""An out-of-sample runs CSV shipped with the tests: Megatron-Bridge's archived performance tables.

``tests/data/megatron_bridge_archive_runs.csv`` transcribes the NeMo 25.11 and 26.02 container tables of
NVIDIA-NeMo/Megatron-Bridge ``docs/performance-summary-archive.md`` (commit 0a25f911): 61 measured
pre-training runs (dense Llama 3 8B/70B/405B and DeepSeek-V3, GPT-OSS-120B, Qwen3-30B-A3B and
Qwen3-235B-A22B MoE; H100, B200, B300, GB200, GB300; BF16, FP8 current scaling, MXFP8, NVFP4) that
are not in ../shared/validation/published_runs.csv and were never used to set a constant. Parsing is
checked here always; simulating all rows takes minutes, so the accuracy table is only printed under
``SIMTRAIN_VALIDATION=1`` (numbers in the README's accuracy section).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simtrain.validation.csv_cells import read_rows
from simtrain.validation.csv_runs import parse_row
from simtrain.validation.fidelity import convention_flops_per_token, convention_of

ARCHIVE = Path(__file__).resolve().parents[1] / "data" / "megatron_bridge_archive_runs.csv"
SLOW = pytest.mark.skipif(not os.environ.get("SIMTRAIN_VALIDATION"),
                          reason="simulates 61 runs up to 1,024 GPUs (minutes); set SIMTRAIN_VALIDATION=1")


@pytest.fixture(scope="module")
def rows() -> list[dict[str, str]]:
    return read_rows(ARCHIVE)


def test_every_archived_run_parses_to_a_run_config(rows: list[dict[str, str]]) -> None:
    """All 61 rows become RunConfigs (no 'not simulatable'), each labelled with its container release."""
    assert len(rows) == 61
    releases = {"25.11": 0, "26.02": 0}
    for row in rows:
        p = parse_row(row)
        assert p.status == "ok" and p.run is not None, (row["run_id"], p.status)
        release = p.source.removeprefix("Megatron-Bridge ")
        releases[release] += 1
        assert row["run_id"].startswith(f"mbridge{release}-")
        n = p.run.layout
        assert n.tp * n.pp * n.cp * n.dp == int(row["n_gpus"]), row["run_id"]
    assert releases == {"25.11": 28, "26.02": 33}


def test_throughput_and_tflops_columns_agree_in_the_causal_convention(rows: list[dict[str, str]]) -> None:
    """The table's two measured columns are independent: model TFLOP/s / tokens/s must be the causal
    convention's FLOPs per token (Megatron-Bridge counts attention at s/(2h)). Within 0.6 % for every
    dense, DeepSeek-V3 and Qwen3 row, which checks the transcription digit by digit; GPT-OSS-120B
    (sliding-window attention on half its layers, counted otherwise there) reports 0.83-0.89 of it."""
    checked = 0
    for row in rows:
        p = parse_row(row)
        assert p.run is not None
        conv = convention_of(p.flop_convention)
        assert conv == "causal"
        per_token = convention_flops_per_token(conv, p.run.model, p.run.train.seq_len)
        ratio = float(row["tflops_per_gpu"]) * 1e12 / float(row["tokens_per_s_per_gpu"]) / per_token
        if "gpt-oss" in row["run_id"]:
            assert 0.82 < ratio < 0.90, row["run_id"]
            continue
        assert ratio == pytest.approx(1.0, abs=0.006), row["run_id"]
        checked += 1
    assert checked == 53


def test_mtp_follows_the_model_cell(rows: list[dict[str, str]]) -> None:
    """'DeepSeekV3 (w/o MTP)' (25.11) drops the multi-token-prediction module; 26.02's rows, which do not
    say, keep the preset's one module."""
    depth = {r["run_id"]: parse_row(r).run.model.mtp_depth for r in rows if "deepseek" in r["run_id"]}  # type: ignore[union-attr]
    assert depth and all(d == (0 if "nomtp" in rid else 1) for rid, d in depth.items())
    assert sum(d == 0 for d in depth.values()) == 4


@SLOW
def test_archive_simulates_every_row_and_its_error_table_is_todays() -> None:
    """Every archived run simulates (status ok), the summary splits the two releases, and the packaged
    error table behind the likely ranges holds today's errors: after a model change, rebuild both tables with
    ``python -m simtrain.validation.regenerate``."""
    import pandas as pd

    from simtrain.studies.uncertainty import ARCHIVE_TABLE, error_table
    from simtrain.validation.fidelity import validate_runs

    frame, summary = validate_runs(ARCHIVE, workers=None)
    assert (frame["status"] == "ok").all(), frame.loc[frame["status"] != "ok", ["run_id", "status"]]
    assert set(summary["by_source"]) == {"Megatron-Bridge 25.11", "Megatron-Bridge 26.02"}
    assert frame["step_time_error_pct"].notna().all()
    fresh, packaged = error_table(frame), pd.read_csv(ARCHIVE_TABLE)
    assert list(packaged["run_id"]) == list(fresh["run_id"])
    assert packaged["step_time_error_pct"].tolist() == pytest.approx(fresh["step_time_error_pct"].tolist(), abs=0.011)
