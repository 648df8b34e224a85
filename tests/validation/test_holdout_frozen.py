"""The frozen hold-out of issue 29: published measured runs the model was never shaped on.

``tests/data/holdout_runs.csv`` was gathered before any model change of issue 29 from sources in
neither ``../shared/validation/published_runs.csv`` nor ``megatron_bridge_archive_runs.csv`` (the
README's "Frozen hold-out (issue 29)" lists them). Its sha256 is recorded here and in the README so
that the file cannot change unnoticed; its per-row errors are not to be looked at before the issue
ends (``benchmarks/holdout_summary.py`` prints aggregates only), so nothing here prints or asserts a
per-row error.
"""

from __future__ import annotations

import csv
import hashlib
import os

import pytest

from simtrain.validation.csv_cells import read_rows
from simtrain.validation.csv_runs import parse_row

from .conftest import PUBLISHED, ROOT

HOLDOUT = ROOT / "tests" / "data" / "holdout_runs.csv"
#: sha256 of the hold-out as frozen on 2026-12-05 (also in README.md, "Frozen hold-out (issue 29)").
HOLDOUT_SHA256 = "6cf9b5e7f85c542fbbeb6182003715b048be51a1ae7506a9f8debedff0b91330"
#: The columns of ../shared/validation/published_runs.csv, in its order (validation/README.md).
PUBLISHED_COLUMNS = (
    "run_id", "source", "source_ref", "model", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab",
    "seq_len", "params_B", "moe_experts", "moe_topk", "moe_ffn_hidden", "gpu", "n_gpus", "gpus_per_node",
    "intra_node", "inter_node", "tp", "pp", "vp", "dp", "cp", "ep", "zero_fsdp", "seq_parallel", "micro_batch",
    "global_batch_seqs", "global_batch_tokens", "grad_accum", "recompute", "precision", "framework", "step_time_s",
    "tokens_per_s_total", "tokens_per_s_per_gpu", "tflops_per_gpu", "tflops_kind", "mfu_pct", "hfu_pct",
    "peak_tflops_used", "peak_mem_gib", "flop_convention", "derived_fields", "uncertain_fields", "simulatable",
    "notes")
#: Sources of the two tables the hold-out must not draw on (substrings of their ``source`` cells).
USED_SOURCES = ("NVIDIA/NeMo docs/source/performance", "Megatron-Bridge", "pytorch/torchtitan",
                "NVIDIA/Megatron-LM", "Korthikanti", "mosaicml/llm-foundry", "bigscience", "OPT", "MegaScale", "PaLM")


def test_holdout_file_is_frozen() -> None:
    """The bytes are those recorded when the hold-out was frozen, and the README records the same hash."""
    digest = hashlib.sha256(HOLDOUT.read_bytes()).hexdigest()
    assert digest == HOLDOUT_SHA256, "tests/data/holdout_runs.csv changed after it was frozen (issue 29)"
    assert HOLDOUT_SHA256 in (ROOT / "README.md").read_text(encoding="utf-8")


def test_holdout_has_the_published_columns_in_order() -> None:
    with HOLDOUT.open(newline="", encoding="utf-8") as fh:
        header = next(csv.reader(fh))
    assert tuple(header) == PUBLISHED_COLUMNS
    if PUBLISHED.is_file():  # the shared table beside the checkout, when there is one
        with PUBLISHED.open(newline="", encoding="utf-8") as fh:
            assert tuple(header) == tuple(next(csv.reader(fh)))


def test_every_row_cites_a_source_outside_both_tables() -> None:
    rows = read_rows(HOLDOUT)
    assert len({r["run_id"] for r in rows}) == len(rows)
    for row in rows:
        assert row["source"] and row["source_ref"] and row["simulatable"], row["run_id"]
        assert not any(used in row["source"] for used in USED_SOURCES), row["run_id"]


def test_at_least_40_rows_simulatable_with_a_measurement() -> None:
    """>= 40 rows parse to a RunConfig, are marked yes/mostly and carry a measured step time or throughput
    (the step time simtrain compares with); checked without simulating or looking at an error."""
    ready = 0
    for row in read_rows(HOLDOUT):
        p = parse_row(row)
        measured = any(row.get(c) for c in ("step_time_s", "tokens_per_s_total", "tokens_per_s_per_gpu",
                                            "tflops_per_gpu"))
        if p.status == "ok" and p.run is not None and p.visible and measured:
            n = p.run.layout
            assert n.tp * n.pp * n.cp * n.dp == int(row["n_gpus"]), row["run_id"]
            ready += 1
    assert ready >= 40


@pytest.mark.skipif(not os.environ.get("SIMTRAIN_VALIDATION"),
                    reason="simulates every hold-out row (minutes); set SIMTRAIN_VALIDATION=1")
def test_at_least_40_rows_simulate_and_compare() -> None:
    """Counts only: the per-row errors of the hold-out stay unread until issue 29 ends."""
    from simtrain.validation.fidelity import validate_runs

    _, summary = validate_runs(HOLDOUT, workers=None)
    assert summary["compared"] >= 40
