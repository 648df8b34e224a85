"""Megatron-LM arguments and torchtitan TOML job configs in and out (simtrain.formats).

Fixtures under tests/data/megatron and tests/data/torchtitan were written by us in those formats. The
round trips check that export then import gives back every field the format carries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from simtrain.formats import (
    read_megatron,
    read_megatron_file,
    read_torchtitan,
    read_torchtitan_file,
    write_megatron,
    write_torchtitan,
)
from simtrain.formats.megatron import parse_args
from simtrain.plan.load import load_config
from simtrain.spec.config import RunConfig
from simtrain.spec.errors import ConfigError
from simtrain.spec.model import preset

DATA = Path(__file__).parent / "data"
EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.yaml"))


def _carried(run: RunConfig) -> dict[str, Any]:
    """The fields both a RunConfig and a Megatron/torchtitan file carry, resolved (auto, None defaults)."""
    lay, tr = run.layout.model_dump(), run.train
    for key in ("order", "grad_bucket_MiB", "fsdp_prefetch_layers", "ep_comm_overlap", "etp"):
        lay.pop(key)
    lay["schedule"], lay["expert_tp"] = run.layout.resolved_schedule, run.layout.expert_tp
    if run.model.moe is not None and lay["ep_dispatcher"] == "auto":
        lay["ep_dispatcher"] = "deepep" if run.model.moe.group_limited else "alltoall"
    model = run.model.model_dump(exclude={"name", "n_kv_heads"})
    model["kv_heads"] = run.model.kv_heads
    train = {"seq_len": tr.seq_len, "micro_batch_size": tr.micro_batch_size, "seqs": tr.global_batch_seqs_resolved,
             "precision": tr.precision, "fp8_recipe": tr.fp8_recipe if tr.precision == "fp8" else None,
             "grad_bytes": tr.grad_bytes, "optimizer": tr.optimizer, "stack": tr.stack,
             "attention_kernel": tr.attention_kernel, "moe_capacity_factor": tr.moe_capacity_factor,
             "dropout": tr.dropout if tr.dropout is not None else run.model.activation == "gelu"}  # fmt: skip
    return {"model": model, "layout": lay, "train": train}


# ---- Megatron-LM --------------------------------------------------------------------------------


def test_megatron_launch_script_fixture() -> None:
    imported = read_megatron_file(DATA / "megatron" / "llama3_8b_pretrain.sh", node="dgx-h100")
    run = imported.config
    assert run.hardware.n_nodes == 2  # torchrun --nnodes $NNODES
    assert run.model.model_dump(exclude={"name"}) == preset("llama3.1-8b").model_dump(exclude={"name"})
    lay = run.layout
    assert (lay.tp, lay.pp, lay.vpp, lay.dp, lay.cp) == (2, 2, 4, 4, 1)  # 32 layers / (pp 2 x 4 per stage)
    assert lay.sequence_parallel and lay.zero_stage == 1 and lay.tp_comm_overlap
    assert lay.overlap_grad_reduce and lay.overlap_param_gather
    assert lay.recompute == "selective" and lay.recompute_modules == ("core_attn", "layernorm")
    tr = run.train
    assert (tr.seq_len, tr.micro_batch_size, tr.global_batch_seqs) == (8192, 1, 128)
    assert (tr.precision, tr.fp8_recipe, tr.stack, tr.grad_dtype) == ("fp8", "delayed", "megatron-te", "fp32")
    assert tr.dropout is None  # 0.0 dropout is a SwiGLU model's default
    assert imported.unknown == ("--my-experimental-flag",)
    assert {"--lr", "--data-path", "--save", "--train-iters", "--tokenizer-model"} <= set(imported.ignored)


def test_megatron_parsing_continuations_comments_variables_and_equals() -> None:
    text = "TP=4\nexport CP=2\npython pretrain_gpt.py \\\n  --tensor-model-parallel-size ${TP} \\\n" \
           "  --context-parallel-size=$CP  # ring attention\n  --recompute-modules core_attn moe_act\n"  # fmt: skip
    flags = parse_args(text)
    assert flags == {"--tensor-model-parallel-size": ["4"], "--context-parallel-size": ["2"],
                     "--recompute-modules": ["core_attn", "moe_act"]}  # fmt: skip


def test_megatron_defaults_follow_arguments_py() -> None:
    """FFN width (SwiGLU: int(8h/3 / 64) * 64), vocabulary padding to 128 x TP, global batch = mbs x dp,
    overlaps off and dropout on unless given."""
    text = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --swiglu --normalization RMSNorm "
            "--position-embedding-type rope --vocab-size 50257 --tensor-model-parallel-size 2 --seq-length 2048 "
            "--micro-batch-size 2 --kv-channels 64 --num-query-groups 4")  # fmt: skip
    imported = read_megatron(text, node="dgx-h100")
    run = imported.config
    # --kv-channels equal to hidden / heads is the default; --num-query-groups needs --group-query-attention
    assert run.model.head_dim is None and run.model.n_kv_heads is None
    assert imported.unknown == () and imported.ignored == ()
    assert run.model.ffn_hidden == int(4 * 1024 * 2 / 3 / 64) * 64 == 2688
    assert run.model.vocab == 50432  # next multiple of 256 above 50257
    assert any("padded to 50432" in n for n in imported.notes)
    assert run.layout.dp == 4 and run.train.global_batch_seqs == 2 * 4
    assert not run.layout.overlap_grad_reduce and not run.layout.overlap_param_gather
    assert run.train.dropout is True and run.model.tied_embeddings and run.model.linear_bias


def test_megatron_moe_layer_freq_expression() -> None:
    base = {"hardware": {"node": "hgx-h800", "n_nodes": 4}}
    text = write_megatron(load_config(DATA.parent.parent / "examples" / "deepseek_v3_h800.yaml"))[0]
    text = text.replace("--moe-layer-freq '[0,0,0," + ",".join(["1"] * 58) + "]'", "--moe-layer-freq '([0]*3+[1]*58)'")
    assert "([0]*3+[1]*58)" in text
    run = read_megatron(text.replace("--expert-model-parallel-size 64", "--expert-model-parallel-size 2")
                        .replace("--global-batch-size 15360", "--global-batch-size 64"), base=base).config
    assert run.model.moe is not None and run.model.moe.first_k_dense == 3 and run.model.moe_layer_indices()[0] == 3
    assert run.model.param_count() == preset("deepseek-v3").param_count()


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_megatron_round_trip_of_every_example(example: Path) -> None:
    run = load_config(example)
    text, skipped = write_megatron(run)
    back = read_megatron(text, base={"hardware": run.hardware.model_dump()})
    assert back.unknown == ()
    mine, theirs = _carried(run), _carried(back.config)
    if run.layout.resolved_schedule == "dualpipe":  # Megatron-LM has no DualPipe: said, and written as 1F1B
        assert any("dualpipe" in s for s in skipped)
        mine["layout"]["schedule"] = theirs["layout"]["schedule"]
    elif run.layout.fsdp == "hybrid":  # nor PyTorch's HSDP: said, and written as the distributed optimizer
        assert any("fsdp=hybrid" in s for s in skipped)
        return
    else:
        assert skipped == []
    assert theirs == mine
    # with the original as base, the fields Megatron does not carry come back too
    kept = read_megatron(text, base=run).config
    assert kept.layout.order == run.layout.order and kept.sim == run.sim and kept.run == run.run


def test_megatron_round_trip_simulates_the_same_step() -> None:
    from simtrain.studies.simulate import simulate

    run = load_config(DATA.parent.parent / "examples" / "llama3_8b_h100_fsdp.yaml")
    back = read_megatron(write_megatron(run)[0], base=run).config
    assert simulate(back).step_time_s == simulate(run).step_time_s


def test_megatron_ddp_bucket_size_sets_the_first_chunks_buckets() -> None:
    """``--ddp-bucket-size`` (parameters) sizes the first stage's first-chunk buckets, as Megatron-core's DDP does:
    later stages keep one bucket; it goes back out on export, and a bad value names the flag."""
    from simtrain.cost.cost_pass import lower
    from simtrain.cost.costs import ComputeCostModel
    from simtrain.lower.ops import CommOp
    from simtrain.studies.simulate import cluster_of

    args = ("--num-layers 8 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --vocab-size 32000 "
            "--micro-batch-size 1 --global-batch-size 32 --bf16 --pipeline-model-parallel-size 2 "
            "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather")
    default = read_megatron(args, node="dgx-h100").config
    run = read_megatron(args + " --ddp-bucket-size 120000000", node="dgx-h100").config
    assert default.train.stack_spec.megatron_bucket_params is None
    assert run.train.stack_spec.megatron_bucket_params == 120_000_000 and run.train.stack_spec.megatron_buckets

    def scatters(r: RunConfig) -> list[list[float]]:
        low = lower(r, ComputeCostModel(cluster_of(r).gpu, stack=r.train.stack_spec))
        return [[op.comm_bytes for op in p.ops if isinstance(op, CommOp) and op.name == "dp.reduce_scatter"]
                for p in low.programs]

    mine, theirs = scatters(run), scatters(default)
    # stage 0 (4 layers of 50.4M parameters and the 69.7M embeddings, fp32 gradients): the default's 40M
    # (dp 4: max(40M, 4M)) closes a bucket at every layer, 120M at every third unit; the last stage is one
    # bucket either way
    assert len(theirs[0]) == 5 and max(theirs[0]) == pytest.approx(69.7e6 * 4, rel=1e-3)
    assert len(mine[0]) == 2 and max(mine[0]) <= (120e6 + 69.7e6) * 4
    assert len(mine[1]) == len(theirs[1]) == 1 and mine[1] == theirs[1]
    assert sum(mine[0]) == pytest.approx(sum(theirs[0]))
    text, skipped = write_megatron(run)
    assert "--ddp-bucket-size 120000000" in text and skipped == []
    assert read_megatron(text, node="dgx-h100").config.train.stack_spec.megatron_bucket_params == 120_000_000
    with pytest.raises(ConfigError) as exc:
        read_megatron(args + " --ddp-bucket-size 0", node="dgx-h100")
    assert exc.value.problems[0].path == "--ddp-bucket-size"


def test_megatron_bad_values_name_the_flag() -> None:
    with pytest.raises(ConfigError) as exc:
        read_megatron("--num-layers 32 --hidden-size x --num-attention-heads 32 --vocab-size 32000", node="dgx-h100")
    assert [p.path for p in exc.value.problems] == ["--hidden-size"]
    assert "'x' is not valid; an integer" in exc.value.problems[0].message
    with pytest.raises(ConfigError) as exc:
        read_megatron("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --vocab-size 32000 "
                      "--tensor-model-parallel-size 3", node="dgx-h100")  # fmt: skip
    assert exc.value.problems[0].path == "--tensor-model-parallel-size"
    assert "does not divide the cluster's 8 GPUs" in exc.value.problems[0].message
    with pytest.raises(ConfigError) as exc:
        read_megatron("--tensor-model-parallel-size 2")
    assert exc.value.problems[0].path == "--num-layers"


# ---- torchtitan -----------------------------------------------------------------------------------


def test_torchtitan_job_fixture() -> None:
    imported = read_torchtitan_file(DATA / "torchtitan" / "llama3_8b.toml", node="dgx-h100", n_nodes=2)
    run = imported.config
    assert run.name == "Llama 3.1 8B, HSDP x TP2"
    assert run.model.model_dump(exclude={"name"}) == preset("llama3.1-8b").model_dump(exclude={"name"})
    lay = run.layout
    assert (lay.tp, lay.dp, lay.fsdp, lay.fsdp_shard_size) == (2, 8, "hybrid", 4)  # 2 replicas x (16 / 2 / 2)
    assert lay.sequence_parallel and lay.tp_comm_overlap and lay.recompute == "op_sac"
    tr = run.train
    assert (tr.micro_batch_size, tr.global_batch_seqs, tr.seq_len) == (2, 128, 8192)
    assert (tr.precision, tr.fp8_recipe, tr.stack) == ("fp8", "current", "torchtitan-compile")
    assert "parallelism.fsdp_reshard_after_forward" in imported.unknown
    assert {"optimizer.lr", "training.steps", "checkpoint.enable"} <= set(imported.ignored)


def _torchtitan_runs() -> list[RunConfig]:
    """torchtitan-style layouts of Llama 3.1 8B/70B: FSDP, HSDP, TP (async), PP (interleaved), CP, float8."""
    def run(model: str, nodes: int, layout: dict[str, Any], **train: Any) -> RunConfig:
        return load_config({"name": "tt", "model": model, "hardware": {"node": "dgx-h100", "n_nodes": nodes},
                            "layout": layout, "train": {"stack": "torchtitan-compile", "seq_len": 8192,
                                                        "global_batch_seqs": 64, **train}})  # fmt: skip

    return [
        run("llama3.1-8b", 1, {"dp": 8, "fsdp": "full"}, micro_batch_size=2),
        run("llama3.1-8b", 2, {"dp": 8, "tp": 2, "fsdp": "hybrid", "fsdp_shard_size": 4, "sequence_parallel": True,
                               "tp_comm_overlap": True, "recompute": "op_sac"}, precision="fp8", fp8_recipe="current"),
        run("llama3.1-70b", 4, {"dp": 4, "tp": 4, "pp": 2, "vpp": 5, "fsdp": "full", "sequence_parallel": True,
                                "recompute": "full"}, stack="torchtitan-eager"),
        run("llama3.1-8b", 2, {"dp": 4, "cp": 4, "fsdp": "full", "cp_comm": "all_gather", "recompute": "full",
                               "recompute_layers": 16}, seq_len=32768, global_batch_seqs=16),
        run("llama3.1-8b", 1, {"dp": 4, "pp": 2, "fsdp": "full", "schedule": "gpipe"}, grad_dtype="bf16"),
    ]  # fmt: skip


@pytest.mark.parametrize("index", range(5))
def test_torchtitan_round_trip(index: int) -> None:
    run = _torchtitan_runs()[index]
    text, skipped = write_torchtitan(run)
    assert skipped == []
    back = read_torchtitan(text, base={"hardware": run.hardware.model_dump()})
    assert back.unknown == ()
    if run.layout.recompute_layers:  # torchtitan checkpoints one layer in n: said in a note
        assert back.notes == ("activation_checkpoint selective_ac_option '2' (one layer in 2): simulated as full "
                              "recompute of 16 of each stage chunk's 32 layers",)
    else:
        assert back.notes == ()
    assert back.config.model_dump(exclude={"name"}) == run.model_dump(exclude={"name"})


def test_torchtitan_export_of_a_megatron_layout_says_what_it_loses() -> None:
    run = load_config(DATA.parent.parent / "examples" / "llama3_70b_h100.yaml")
    text, skipped = write_torchtitan(run)
    assert any("zero_stage 1" in s for s in skipped) and any("recompute selective" in s for s in skipped)
    assert all(f"# not expressible: {s}" in text for s in skipped)
    back = read_torchtitan(text, base=run).config  # the model has no torchtitan flavor: the base's is kept
    assert (back.layout.tp, back.layout.pp, back.layout.vpp, back.layout.dp) == (8, 2, 5, 4)
    assert back.model == run.model


def test_torchtitan_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as exc:
        read_torchtitan("[model]\nname = 'llama3'\nflavor = '7B'\n")
    assert exc.value.problems[0].path == "model.flavor"
    with pytest.raises(ConfigError) as exc:
        read_torchtitan("[model]\nname = 'llama3'\nflavor = '8B'\n[parallelism]\npipeline_parallel_degree = 2\n"
                        "pipeline_parallel_schedule = 'ZBVZeroBubble'\n")  # fmt: skip
    assert exc.value.problems[0].path == "parallelism.pipeline_parallel_schedule"
    with pytest.raises(ConfigError) as exc:
        read_torchtitan("[model\n")
    assert exc.value.problems[0].path == "torchtitan"
    with pytest.raises(ConfigError) as exc:
        read_torchtitan("[model]\nname = 'llama3'\nflavor = '8B'\n[parallelism]\ntensor_parallel_degree = 'two'\n")
    assert exc.value.problems[0].path == "parallelism.tensor_parallel_degree"
