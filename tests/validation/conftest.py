"""Shared fixtures of the validation tests: the published-runs CSV and small hand-made CSVs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The measured runs (../shared/validation/published_runs.csv beside the checkout), or $SIMTRAIN_RUNS_CSV.
PUBLISHED = ROOT.parent / "shared" / "validation" / "published_runs.csv"

COLUMNS = ["run_id", "source", "model", "n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab", "seq_len", "gpu", "n_gpus", "gpus_per_node", "inter_node", "tp", "pp", "vp", "dp", "cp", "ep", "zero_fsdp", "seq_parallel", "micro_batch", "global_batch_seqs", "recompute", "precision", "framework", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "tflops_kind", "mfu_pct", "peak_mem_gib", "flop_convention", "simulatable"]

#: Small rows that simulate in well under a second each (a Llama-3-8B-shaped model cut to 4 layers).
SMALL_ROWS = [
    dict(run_id="tiny-fsdp", source="pytorch/torchtitan test", model="llama3-8b-4l", n_layers="4", hidden="4096",
         n_heads="32", n_kv_heads="8", ffn_hidden="14336", vocab="128256", seq_len="4096",
         gpu="H100 SXM 96GB HBM2e @500W (Grand Teton)", n_gpus="8", gpus_per_node="8", tp="1", pp="1", dp="8",
         cp="1", zero_fsdp="FSDP8 (FSDP2, ZeRO-3-like)", micro_batch="1", global_batch_seqs="8",
         recompute="full", precision="bf16", framework="torchtitan (torch.compile)", step_time_s="0.5",
         peak_mem_gib="20.0", simulatable="yes"),
    dict(run_id="tiny-tp-fp8", source="NVIDIA/NeMo docs/source/performance/performance_summary.md",
         model="GPT-tiny", n_layers="4", hidden="2048", n_heads="16", n_kv_heads="16", ffn_hidden="8192",
         vocab="51200", seq_len="2048", gpu="H100 (DGX-H100)", n_gpus="16", tp="2", pp="1", dp="8",
         micro_batch="2", global_batch_seqs="32", precision="fp8 (hybrid, TE)",
         framework="NeMo 24.07 (Megatron-Core)", tokens_per_s_per_gpu="40000", tflops_per_gpu="500",
         tflops_kind="model", flop_convention="NeMo (12Lh^2(1+g/a+s/h)+18Lfh+6Vh)", simulatable="mostly"),
    dict(run_id="tiny-unknown-gpu", source="someone's blog", model="GPT-tiny", n_layers="4", hidden="2048",
         n_heads="16", ffn_hidden="8192", vocab="51200", seq_len="2048", gpu="Some future GPU", n_gpus="8",
         tp="1", pp="1", dp="8", micro_batch="1", global_batch_seqs="8", framework="JAX thing",
         step_time_s="0.2", simulatable="yes"),
    dict(run_id="tiny-no-layers", source="someone", model="mystery", hidden="2048", n_heads="16",
         ffn_hidden="8192", vocab="51200", seq_len="2048", gpu="A100", n_gpus="8", tp="1", dp="8",
         global_batch_seqs="8", step_time_s="1.0", simulatable="no"),
    dict(run_id="tiny-bad-layout", source="someone", model="GPT-tiny", n_layers="4", hidden="2048",
         n_heads="16", ffn_hidden="8192", vocab="51200", seq_len="2048", gpu="A100 80GB", n_gpus="8", tp="3",
         dp="1", pp="1", global_batch_seqs="8", step_time_s="1.0", simulatable="yes"),
]


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    """Write rows (missing columns blank) with the published CSV's column names."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in COLUMNS})
    return path


@pytest.fixture
def small_csv(tmp_path: Path) -> Path:
    """A CSV of ``SMALL_ROWS``: two simulatable rows, an unknown GPU, a missing field, a bad layout."""
    return write_csv(tmp_path / "runs.csv", SMALL_ROWS)


@pytest.fixture(scope="session")
def published_csv() -> Path:
    """The published runs CSV; the test is skipped when the shared folder is not beside the checkout."""
    if not PUBLISHED.is_file():
        pytest.skip(f"{PUBLISHED} not found")
    return PUBLISHED
