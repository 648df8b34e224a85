"""Parsing published-run rows: free-text cells, nearest defaults named in assumptions, missing fields."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from simtrain.cli.main import main
from simtrain.spec.errors import ConfigError
from simtrain.spec.model import preset
from simtrain.spec.stacks import STACKS, get_stack, stack_from_text
from simtrain.validation.csv_cells import (
    COLUMN_LIMITS,
    number,
    parse_gpu,
    parse_precision,
    parse_recompute,
    parse_sharding,
    read_rows,
)
from simtrain.validation.csv_runs import _gpus_per_node, parse_row

from .conftest import SMALL_ROWS, write_csv


@pytest.mark.parametrize(("cell", "value"), [("2M (approx)", 2e6), ("up to 147", 147.0),
                                             ("47 (README: '47% MFU')", 47.0), ("1,024", 1024.0), ("3.5", 3.5)])
def test_number_reads_the_first_number_and_says_so(cell: str, value: float) -> None:
    notes: list[str] = []
    assert number({"x": cell}, "x", notes) == pytest.approx(value)
    assert bool(notes) == (cell not in ("3.5", "1,024"))


def test_number_blank_and_text() -> None:
    notes: list[str] = []
    assert number({"x": ""}, "x", notes) is None
    assert number({"x": "nan"}, "x", notes) is None
    assert number({"x": "unknown"}, "x", notes) is None and "no number" in notes[0]


@pytest.mark.parametrize(("cell", "gpu", "node", "assumed"), [
    ("H100 80GB (DGX Cloud)", "h100-sxm", "dgx-h100", False),
    ("H100 (DGX-H100)", "h100-sxm", "dgx-h100", False),
    ("H100 SXM 96GB HBM2e @500W (Grand Teton)", "h100-sxm-96gb-500w", "dgx-h100", False),
    ("H200", "h200", "hgx-h200", False),
    ("A100 80GB (Selene)", "a100-80gb", "dgx-a100", False),
    ("a100_80gb", "a100-80gb", "dgx-a100", False),
    ("A100 (Selene)", "a100-80gb", "dgx-a100", True),
    ("A100 40GB", "a100-40gb", "hgx-a100-40gb", False),
    ("GB200 NVL72", "gb200", "gb200-nvl72", False),
    ("B200", "b200", "dgx-b200", False),
    ("GB300 NVL72", "gb300", "gb300-nvl72", False), ("DGX-B300", "b300", "dgx-b300", False),
    ("TPU v4", "h100-sxm", "dgx-h100", True),
    ("", "h100-sxm", "dgx-h100", True),
    # no profile: the nearest part of the same family or generation, named in the assumptions
    ("A800 80GB", "a100-80gb", "dgx-a100", True),
    ("V100 32GB", "a100-40gb", "hgx-a100-40gb", True),
    ("MI250X", "mi300x", "mi300x-8", True),
    ("L40S", "a100-40gb", "hgx-a100-40gb", True), ("A10G", "a100-40gb", "hgx-a100-40gb", True),
    ("RTX 4090", "a100-40gb", "hgx-a100-40gb", True),
    # PCIe / NVL parts of a profiled GPU: the SXM profile, named
    ("A100 40GB PCIe", "a100-40gb", "hgx-a100-40gb", True), ("H200 NVL", "h200", "hgx-h200", True),
    ("H100 PCIe", "h100-sxm", "dgx-h100", True),
])
def test_parse_gpu(cell: str, gpu: str, node: str, assumed: bool) -> None:
    g, n, note = parse_gpu(cell)
    assert (g, n) == (gpu, node)
    assert (note is not None) == assumed


@pytest.mark.parametrize(("cell", "precision", "recipe"), [
    ("bf16 (inferred: 408.8 TFLOP/s = 41% => peak ~989)", "bf16", None),
    ("fp16 mixed", "fp16", None), ("fp16/bf16 mixed", "bf16", None), ("amp_bf16", "bf16", None),
    ("fp8 (hybrid, TE)", "fp8", "delayed"), ("fp8-cs", "fp8", "current"), ("fp8 tensorwise", "fp8", "current"),
    ("fp8 (float8 linears)", "fp8", "current"), ("fp8-mx", "fp8", "blockwise"), ("mxfp8", "fp8", "blockwise"),
    ("nvfp4", "fp8", "blockwise"),  # on a GPU without FP4 (has_fp4 not given): the nearest it runs, named
])
def test_parse_precision(cell: str, precision: str, recipe: str | None) -> None:
    p, r, _ = parse_precision(cell, STACKS["megatron-te"], has_fp8=True)
    assert p == precision
    if recipe:
        assert r == recipe


def test_fp4_is_fp4_on_blackwell_and_block_scaled_fp8_elsewhere_named() -> None:
    assert parse_precision("NVFP4", STACKS["megatron-te"], True, has_fp4=True)[0] == "fp4"
    assert "without FP4 tensor cores: block-scaled FP8" in parse_precision("NVFP4", STACKS["megatron-te"], True)[2][0]
    assert parse_precision("nvfp4", STACKS["megatron-te"], has_fp8=False)[0] == "bf16"


def test_fp8_on_a_gpu_without_fp8_falls_back_to_bf16_with_an_assumption() -> None:
    p, _, notes = parse_precision("fp8 (hybrid, TE)", STACKS["megatron-te"], has_fp8=False)
    assert p == "bf16" and "without FP8" in notes[0]


@pytest.mark.parametrize(("cell", "modules"), [
    ("selective (moe_act, mlp)", ("act",)),
    ("selective (core_attn, layernorm, mla_up_proj, moe_act)", ("core_attn", "layernorm", "mla_up_proj", "act")),
    ("selective (attention)", ("core_attn",)),
    ("selective", ()),
])
def test_recompute_modules_named_in_the_cell(cell: str, modules: tuple[str, ...]) -> None:
    from simtrain.validation.csv_cells import recompute_modules_of
    assert recompute_modules_of(cell)[0] == modules


@pytest.mark.parametrize(("cell", "recompute", "assumed"), [
    ("full", "full", False), ("full (activation checkpointing)", "full", False),
    ("full (DeepSpeed activation checkpointing)", "full", False),
    ("selective (attention core)", "selective", False), ("selective (op-level SAC)", "op_sac", False),
    ("selective (per-op SAC)", "op_sac", False), ("selective (op SAC, config default)", "op_sac", False),
    ("", "none", True), ("none", "none", False), ("disabled", "none", False), ("gradient checkpointing", "full", False),
    ("AC", "full", False), ("yes", "full", True), ("true", "full", True), ("maybe", "none", True),
])
def test_parse_recompute(cell: str, recompute: str, assumed: bool) -> None:
    r, notes = parse_recompute(cell, "megatron-te")
    assert r == recompute and bool(notes) == assumed


@pytest.mark.parametrize(("cell", "fields"), [
    ("FSDP8 (FSDP2, ZeRO-3-like)", {"fsdp": "full"}), ("FULL_SHARD (PyTorch FSDP, mixed_precision=PURE)",
                                                        {"fsdp": "full"}),
    ("SHARD_GRAD_OP", {"zero_stage": 2}), ("ZeRO-1 (DeepSpeed BF16_Optimizer)", {"zero_stage": 1}),
    ("distributed optimizer (DDP)", {"zero_stage": 1}), ("", {"zero_stage": 1}),
    ("ZeRO stage 3", {"fsdp": "full"}), ("DeepSpeed ZeRO stage 2", {"zero_stage": 2}), ("zero1", {"zero_stage": 1}),
    ("ZeRO-Infinity", {"fsdp": "full"}), ("DDP", {}), ("none", {}),
    ("HYBRID_SHARD (shard 8)", {"fsdp": "hybrid", "fsdp_shard_size": 8}),
    ("HSDP dp_shard=16", {"fsdp": "hybrid", "fsdp_shard_size": 16}),
    ("HSDP (2x64)", {"fsdp": "hybrid", "fsdp_shard_size": 64}),  # torchtitan's (dp_replicate, dp_shard)
    ("HSDP (1x128)", {"fsdp": "full"}),  # one shard group spanning dp is full sharding
    ("hybrid shard", {"fsdp": "full"}), ("HSDP shard 48", {"fsdp": "full"}),  # no group / 48 does not divide 128
])
def test_parse_sharding(cell: str, fields: dict) -> None:
    assert parse_sharding(cell, STACKS["megatron-te"], dp=128)[0] == fields


@pytest.mark.parametrize("cell", ["hybrid shard", "HSDP shard 48", "HSDP (2x64)", "sharded somehow"])
def test_a_sharding_guess_is_named(cell: str) -> None:
    assert parse_sharding(cell, STACKS["megatron-te"], dp=128)[1]


def test_an_hsdp_row_simulates_hybrid_sharding() -> None:
    row = {k: str(v) for k, v in SMALL_ROWS[0].items()}
    row.update(zero_fsdp="HSDP (2x4)")
    p = parse_row(row)
    assert p.status == "ok" and p.run is not None, p.status
    assert (p.run.layout.fsdp, p.run.layout.fsdp_shard_size) == ("hybrid", 4)


@pytest.mark.parametrize(("cell", "stack", "assumed"), [
    ("Megatron-Core r0.8.0", "megatron-core", False), ("NeMo 24.07 (Megatron-Core)", "megatron-te-2024", False),
    ("NeMo (Megatron-Core, NeMo launcher gpt3_175b_hydra.yaml)", "megatron-te-2024", False),
    ("NeMo dev container (Megatron-Core)", "megatron-te", False), ("NeMo 25.04", "megatron-te", False),
    ("Megatron-Bridge / NeMo 25.11", "megatron-te", False), ("Megatron-Bridge / NeMo 24.12", "megatron-te", False),
    ("Megatron-LM (2021)", "megatron-legacy", False), ("Megatron-LM (2022)", "megatron-legacy", False),
    ("torchtitan (eager)", "torchtitan-eager", False), ("torchtitan (compile+Float8)", "torchtitan-compile", False),
    ("torchtitan + torch.compile (asyncTP)", "torchtitan-compile", False),
    ("Composer/llm-foundry (FlashAttention)", "composer-fsdp", False), ("Megatron-DeepSpeed", "deepspeed", False),
    ("Pathways (JAX)", "megatron-te", True), ("", "megatron-te", True),
])
def test_stack_from_framework_text(cell: str, stack: str, assumed: bool) -> None:
    s, note = stack_from_text(cell)
    assert s.name == stack and (note is not None) == assumed


def test_a_nemo_row_is_dated_by_its_source_too() -> None:
    # the framework cell names NeMo without a version; the source dates the container
    assert stack_from_text("NeMo (Megatron-Core)", "NeMo 24.09 container")[0].name == "megatron-te-2024"
    assert stack_from_text("NeMo (Megatron-Core)", "NeMo 25.07 container")[0].name == "megatron-te"


def test_unknown_stack_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="known stacks"):
        get_stack("jax")


def test_small_rows_parse_with_status_and_assumptions() -> None:
    parsed = {r["run_id"]: parse_row({k: str(v) for k, v in r.items()}) for r in SMALL_ROWS}
    fsdp = parsed["tiny-fsdp"]
    assert fsdp.status == "ok" and fsdp.run is not None
    assert fsdp.run.layout.fsdp == "full" and fsdp.run.layout.recompute == "full"
    assert fsdp.run.hardware.gpu == "h100-sxm-96gb-500w" and fsdp.run.train.stack == "torchtitan-compile"
    assert fsdp.measured_peak_mem_bytes == pytest.approx(20.0 * 1024**3)
    tp = parsed["tiny-tp-fp8"]
    assert tp.run is not None and tp.run.train.precision == "fp8" and tp.run.train.fp8_recipe == "delayed"
    assert tp.run.layout.sequence_parallel and tp.run.layout.zero_stage == 1
    assert any("seq_parallel not given" in a for a in tp.assumptions)
    unknown = parsed["tiny-unknown-gpu"]
    assert unknown.status == "ok" and unknown.gpu_type == "h100-sxm"
    assert any("has no profile" in a for a in unknown.assumptions)
    assert parsed["tiny-no-layers"].status == "not simulatable: n_layers"
    assert parsed["tiny-bad-layout"].status.startswith("error:") and "layout.tp" in parsed["tiny-bad-layout"].status


def test_read_rows_errors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="not found"):
        read_rows(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ConfigError, match="run_id"):
        read_rows(bad)
    surplus = tmp_path / "surplus.csv"
    surplus.write_text("run_id,source\nok,s\nx,y,z\n")  # DictReader files the third cell under None
    with pytest.raises(ConfigError, match="line 3 has more cells than the header's 2 columns"):
        read_rows(surplus)
    prose = tmp_path / "notes.md"
    prose.write_text("# runs\n\nsome text, with a comma, and more\n")
    with pytest.raises(ConfigError, match="lacks the column"):
        read_rows(prose)


def test_published_rows_all_parse_and_visible_ones_simulatable(published_csv) -> None:  # type: ignore[no-untyped-def]
    rows = read_rows(published_csv)
    parsed = [parse_row(r) for r in rows]
    assert len(parsed) == len(rows) >= 80
    for p in parsed:
        assert p.status == "ok" or p.status.startswith(("not simulatable: ", "error: "))
    # the rows with no architecture or layout say which field is missing
    status = {p.run_id: p.status for p in parsed}
    assert status["nemo2407-GPT3-5B-64"] == "not simulatable: n_layers"
    # heads not given, but the layers and width it gives are those of the SC'21 GPT-1.7B preset it names
    assert status["sc21-a100-1.7B"] == "ok"
    assert status["mcore-mixtral-8x7b-h100"] == "not simulatable: n_gpus"  # no layout either
    # a layout without its GPU count: the smallest world that holds it, named (PP8 x EP32 -> 256)
    guide = next(p for p in parsed if p.run_id == "mcore-dsv3-gb200-guide")
    assert guide.status == "ok" and guide.n_gpus == 256 and guide.run is not None
    assert any(a.startswith("n_gpus not given: 256 assumed") for a in guide.assumptions)
    assert guide.run.layout.recompute_modules == ("act",) and not guide.run.layout.sequence_parallel


def test_moe_row_whose_ep_folds_only_with_expert_tp_1_gets_etp_1_named() -> None:
    """TP2 EP8 over a stage of tp x dp = 8 ranks: with expert TP = tp (2) the experts would need 16
    ranks; Megatron's MoE parallel folding runs them at expert TP 1, said in the assumptions."""
    row = dict(run_id="moe-fold", source="NVIDIA-NeMo/Megatron-Bridge", model="Qwen3_30B_a3B", seq_len="4096",
               moe_experts="128", moe_topk="8", gpu="H100", n_gpus="8", tp="2", pp="1", dp="4", ep="8",
               micro_batch="1", global_batch_seqs="8", precision="bf16", framework="Megatron-Bridge",
               step_time_s="1.0", simulatable="mostly")
    p = parse_row(row)
    assert p.status == "ok" and p.run is not None
    assert p.run.layout.etp == 1 and p.run.layout.expert_data_degree == 1
    assert any("etp 1 assumed" in a for a in p.assumptions)
    fits = parse_row({**row, "ep": "4"})  # 4 x 2 = 8 ranks: expert TP = tp folds, nothing assumed
    assert fits.run is not None and fits.run.layout.etp is None
    assert not any("etp" in a for a in fits.assumptions)


def test_megatron_core_scripts_run_the_unfused_cross_entropy() -> None:
    """Megatron-LM's --cross-entropy-loss-fusion is off unless asked: 52 bytes per logit element vs 40 for
    the jit-fused path of NeMo / Megatron-Bridge recipes, both against 16 for one fused kernel (stack_spec
    module docstring)."""
    from simtrain.spec.stacks import get_stack

    core, te = get_stack("megatron-core"), get_stack("megatron-te")
    assert core.fusion_of("cross_entropy").bytes_factor == pytest.approx(52 / 16)
    assert te.fusion_of("cross_entropy").bytes_factor == pytest.approx(40 / 16)
    assert core.fusion_of("ln1").bytes_factor == te.fusion_of("ln1").bytes_factor


def _tiny(**cells: str) -> dict[str, str]:
    row = {k: str(v) for k, v in SMALL_ROWS[2].items()}
    row.update(cells)
    return row


@pytest.mark.parametrize("col", ["tp", "pp", "dp", "cp", "n_gpus", "seq_len", "micro_batch", "hidden", "n_layers"])
def test_a_zero_or_negative_count_is_an_error_naming_the_column(col: str) -> None:
    for cell in ("0", "-2"):
        status = parse_row(_tiny(**{col: cell})).status
        assert status.startswith(f"error: {col}: '{cell}': must be a positive integer"), status


def test_a_model_the_spec_rejects_is_an_error_with_the_field_path() -> None:
    status = parse_row(_tiny(ffn_hidden="4096", n_heads="3")).status  # 2048 hidden / 3 heads
    assert status == "error: model: n_heads=3 does not divide hidden=2048; set head_dim", status


@pytest.mark.parametrize(("gpu", "n_gpus", "per_node", "nodes"), [
    ("GB200 NVL72", "64", 64, 1),    # 16 of a rack's 18 trays
    ("GB200 NVL72", "256", 64, 4),   # the fewest racks that hold them, filled equally in whole trays
    ("GB200 NVL72", "144", None, 2),
    ("H100 (DGX-H100)", "4", 4, 1),  # part of one node
])
def test_jobs_on_part_of_a_node_or_rack_are_simulated_with_the_assumption_named(
        gpu: str, n_gpus: str, per_node: int | None, nodes: int) -> None:
    p = parse_row(_tiny(gpu=gpu, n_gpus=n_gpus, dp=n_gpus, global_batch_seqs=n_gpus))
    assert p.status == "ok" and p.run is not None, p.status
    assert (p.run.hardware.gpus_per_node, p.run.hardware.n_nodes) == (per_node, nodes)
    assert (per_node is None) != any("node(s) of" in a for a in p.assumptions)


def test_a_row_on_four_gpu_nodes_runs_on_four_gpu_nodes() -> None:
    p = parse_row(_tiny(gpu="A100 40GB", gpus_per_node="4", n_gpus="16", dp="16", global_batch_seqs="16"))
    assert p.status == "ok" and p.run is not None, p.status
    assert (p.run.hardware.gpus_per_node, p.run.hardware.n_nodes) == (4, 4)
    assert any(a.startswith("gpus_per_node 4: nodes of 4 GPUs") for a in p.assumptions)


def test_gpus_that_fill_no_whole_node_are_not_simulatable() -> None:
    assert parse_row(_tiny(n_gpus="12", dp="12", global_batch_seqs="12")).status.startswith("not simulatable: n_gpus")


def test_a_row_naming_deepep_dispatches_once_per_remote_node() -> None:
    moe = dict(model="Qwen3_30B_a3B", moe_experts="128", moe_topk="8", moe_ffn_hidden="768", n_layers="48",
               hidden="2048", n_heads="32", n_kv_heads="4", vocab="151936", ep="8", notes="HybridEP dispatcher")
    p = parse_row(_tiny(**moe))
    assert p.status == "ok" and p.run is not None and p.run.layout.ep_dispatcher == "deepep", p.status
    assert any("DeepEP/HybridEP named" in a for a in p.assumptions)
    plain = parse_row(_tiny(**{**moe, "notes": ""}))
    assert plain.run is not None and plain.run.layout.ep_dispatcher == "auto"
    assert not plain.run.layout.ep_comm_overlap
    overlapped = parse_row(_tiny(**{**moe, "notes": "moe_a2a_overlap on"}))
    assert overlapped.run is not None and overlapped.run.layout.ep_comm_overlap


@pytest.mark.parametrize(("model", "key"), [("Llama-3.1-70B", "llama3.1-70b"), ("llama3-8b", "llama3-8b"),
                                            ("DeepSeek-V3", "deepseek-v3")])
def test_a_row_without_architecture_columns_takes_the_preset_it_names(model: str, key: str) -> None:
    cells = {c: "" for c in ("n_layers", "hidden", "n_heads", "n_kv_heads", "ffn_hidden", "vocab")}
    p = parse_row(_tiny(model=model, **cells))
    assert p.run is not None and any(a == f"model: preset {key} by its name (architecture columns not given)"
                                     for a in p.assumptions), p.status
    assert p.run.model.n_layers == preset(key).n_layers
    assert parse_row(_tiny(model="Some 9B", **cells)).status == "not simulatable: n_layers"
    # a given column that disagrees with the named preset: the row is not guessed
    assert parse_row(_tiny(model=model, **{**cells, "hidden": "1234"})).status == "not simulatable: n_layers"


def test_a_csv_saved_with_a_byte_order_mark_reads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bom.csv"
    path.write_text("run_id,model\r\nx,llama3-8b\r\n", encoding="utf-8-sig")
    assert read_rows(path) == [{"run_id": "x", "model": "llama3-8b"}]


def test_a_flop_convention_that_counts_the_recompute_forward_means_the_run_recomputed() -> None:
    sc21 = "96*B*s*l*h^2*(1+s/(6h)+V/(16*l*h)) incl. activation-recompute forward"
    p = parse_row(_tiny(flop_convention=sc21))
    assert p.run is not None and p.run.layout.recompute == "full"
    assert any(a.startswith("recompute not given: full assumed") for a in p.assumptions)
    nemo = parse_row(_tiny(flop_convention="Model TFLOP/s/GPU, no recompute"))
    assert nemo.run is not None and nemo.run.layout.recompute == "none"
    stated = parse_row(_tiny(flop_convention=sc21, recompute="selective"))
    assert stated.run is not None and stated.run.layout.recompute == "selective"  # the cell wins


@pytest.mark.parametrize(("framework", "vpp", "micro"), [
    ("torchtitan (torch.compile, PP schedule 1F1B)", 1, 4),
    ("torchtitan (torch.compile, PP schedule interleaved 1F1B)", 2, 2),
])
def test_torchtitan_splits_the_local_batch_into_one_micro_batch_per_pipeline_stage(
        framework: str, vpp: int, micro: int) -> None:
    """torchtitan's build_pipeline_schedule (late 2024): pipeline_parallel_microbatches defaults to
    pp x stages per rank, and a looped schedule's split gives each rank 2 stages."""
    row = {k: str(v) for k, v in SMALL_ROWS[0].items()}
    row.update(framework=framework, pp="2", dp="4", micro_batch="8", global_batch_seqs="32")
    p = parse_row(row)
    assert p.status == "ok" and p.run is not None, p.status
    assert (p.run.layout.vpp, p.run.train.micro_batch_size) == (vpp, micro)
    assert any(f"split into {2 * vpp} micro-batches of {micro}" in a for a in p.assumptions)


@pytest.mark.parametrize(("cell", "layers"), [
    ("full", None), ("full (uniform, 1 layer)", None),  # Megatron's uniform method checkpoints every layer
    ("full (every other layer)", 2), ("full AC every 4th layer", 1), ("full, 3 of 4 layers", 3),
    ("full (block, 1 layer per stage)", 1),  # --recompute-num-layers with the block method: per chunk
])
def test_full_recompute_of_part_of_the_layers(cell: str, layers: int | None) -> None:
    row = {k: str(v) for k, v in SMALL_ROWS[0].items()}  # 4 layers, no pipeline
    row.update(recompute=cell)
    p = parse_row(row)
    assert p.status == "ok" and p.run is not None, p.status
    assert (p.run.layout.recompute, p.run.layout.recompute_layers) == ("full", layers)
    assert (layers is None) != any(a.startswith(f"recompute {cell!r}") for a in p.assumptions)


@pytest.mark.parametrize(("cells", "tp", "pp", "note"), [
    (dict(tp="", pp="2", dp="2"), 2, 2, "tp not given: 2 = n_gpus / the other degrees"),
    (dict(tp="2", pp="", dp="2"), 2, 2, "pp not given: 2 = n_gpus / the other degrees"),
    (dict(tp="", pp="", dp=""), 1, 1, "tp not given: 1 assumed"),
])
def test_a_blank_tp_or_pp_is_what_the_gpu_count_leaves(cells: dict[str, str], tp: int, pp: int, note: str) -> None:
    row = {k: str(v) for k, v in SMALL_ROWS[0].items()}  # 8 GPUs
    row.update(cells)
    p = parse_row(row)
    assert p.status == "ok" and p.run is not None, p.status
    assert (p.run.layout.tp, p.run.layout.pp, p.run.layout.tp * p.run.layout.pp * p.run.layout.dp) == (tp, pp, 8)
    assert note in p.assumptions


def test_a_moe_model_without_a_preset_is_built_from_its_columns() -> None:
    moe = dict(model="DBRX-132B", n_layers="4", hidden="6144", n_heads="48", n_kv_heads="8", vocab="100352",
               ffn_hidden="", moe_experts="16", moe_topk="4", moe_ffn_hidden="10752", ep="8")
    p = parse_row(_tiny(**moe))
    assert p.status == "ok" and p.run is not None, p.status
    m = p.run.model
    assert m.moe is not None and (m.moe.n_experts, m.moe.top_k, m.moe.ffn_hidden, m.moe.n_shared_experts) == (
        16, 4, 10752, 0)
    assert (m.activation, m.norm, m.position, m.n_kv_heads) == ("swiglu", "rmsnorm", "rope", 8)
    assert any(a.startswith("model 'DBRX-132B': no MoE preset") for a in p.assumptions)
    # a MoE column it needs, blank: not simulatable, naming the column
    assert parse_row(_tiny(**dict(moe, moe_ffn_hidden=""))).status == "not simulatable: moe_ffn_hidden"


def test_cpu_offload_column_sets_the_offloaded_layers_and_names_them() -> None:
    """The optional ``cpu_offload_layers`` column (Megatron ``cpu_offloading_num_layers``) reaches the
    layout; a layer count Megatron-core rejects is an error row naming the layout field."""
    p = parse_row(_tiny(cpu_offload_layers="2"))
    assert p.status == "ok" and p.run is not None, p.status
    assert p.run.layout.offload_activation_layers == 2
    assert any("offloaded to CPU memory" in a for a in p.assumptions)
    assert parse_row(_tiny(cpu_offload_layers="")).run.layout.offload_activation_layers == 0  # type: ignore[union-attr]
    status = parse_row(_tiny(cpu_offload_layers="4")).status  # all 4 layers of the tiny model
    assert status.startswith("error:") and "layout.offload_activation_layers" in status, status
    assert parse_row(_tiny(cpu_offload_layers="-1")).status.startswith("error: cpu_offload_layers")


def _domains_by_search(n_gpus: int, node_gpus: int) -> int | None:
    """GPUs per NVLink domain as the fewest domains holding ``n_gpus`` in equal whole 4-GPU trays, by
    trying every domain count (the definition; what csv_runs did in a loop of up to n_gpus steps)."""
    for domains in range(-(-n_gpus // node_gpus), n_gpus + 1):
        if n_gpus % domains == 0 and (n_gpus // domains) % 4 == 0:
            return n_gpus // domains
    return None


@pytest.mark.parametrize("node_gpus", [72, 36])
def test_rack_scale_nodes_per_domain_in_closed_form_match_the_search(node_gpus: int) -> None:
    for n in range(node_gpus + 1, 3000):
        if n % node_gpus:
            assert _gpus_per_node(n, node_gpus) == _domains_by_search(n, node_gpus), n


def test_a_prime_gpu_count_on_nvl72_answers_at_once() -> None:
    start = time.perf_counter()
    assert _gpus_per_node(1_000_000_007, 72) is None  # prime: no whole trays; the loop ran ~10^9 steps
    assert _gpus_per_node(4 * 1_000_000_007, 72) == 4  # 10^9 one-tray domains: the fewest that hold them
    assert time.perf_counter() - start < 0.1


@pytest.mark.parametrize(("col", "cell"), [("seq_len", "1e30"), ("n_gpus", "1000000007"), ("n_layers", "1e30"),
                                           ("tp", "1e30"), ("micro_batch", "1e30"), ("global_batch_seqs", "1e30"),
                                           ("hidden", "1e12"), ("vocab", "1e400")])
def test_a_cell_past_any_real_run_is_an_error_row_naming_the_column(col: str, cell: str) -> None:
    start = time.perf_counter()
    p = parse_row(_tiny(gpu="GB200 NVL72", **{col: cell}))
    assert p.status.startswith(f"error: {col}: '{cell}'"), p.status
    assert p.run is None and time.perf_counter() - start < 10
    if col in COLUMN_LIMITS and cell != "1e400":
        assert f"at most {COLUMN_LIMITS[col]:,}" in p.status


@pytest.mark.parametrize(("col", "cell"), [("step_time_s", "-5"), ("step_time_s", "0"), ("peak_mem_gib", "-1"),
                                           ("tokens_per_s_per_gpu", "0")])
def test_a_measured_value_that_is_not_positive_is_an_error_row(col: str, cell: str) -> None:
    assert parse_row(_tiny(**{col: cell})).status == f"error: {col}: '{cell}' is not valid; a positive measured " \
                                                     "value (or blank)"


def test_a_bad_row_is_an_error_row_the_summary_leaves_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write_csv(tmp_path / "good.csv", SMALL_ROWS[:1])
    bad = write_csv(tmp_path / "bad.csv", [SMALL_ROWS[0], {**SMALL_ROWS[0], "run_id": "typo", "seq_len": "1e30"},
                                           {**SMALL_ROWS[0], "run_id": "neg", "step_time_s": "-0.5"}])
    assert main(["validate", str(good), "--json", "--workers", "1"]) == 0
    clean = json.loads(capsys.readouterr().out)["summary"]
    assert main(["validate", str(bad), "--json", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    summary = out["summary"]
    assert summary["errors"] == 2 + clean["errors"] and summary["step_time"] == clean["step_time"]
    status = {r["run_id"]: r["status"] for r in out["rows"]}
    assert status["typo"].startswith("error: seq_len: '1e30'") and status["neg"].startswith("error: step_time_s")


def test_a_csv_with_a_header_and_no_rows_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = write_csv(tmp_path / "empty.csv", [])
    assert main(["validate", str(empty), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert "has a header but no rows" in err and str(empty) in err and "Traceback" not in err
    assert main(["validate", str(tmp_path), "--workers", "1"]) == 2
    assert "is a directory, not a CSV file" in capsys.readouterr().err
