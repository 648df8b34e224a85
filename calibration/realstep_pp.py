"""A real pipeline-parallel training step: transformers' Llama split into stages, run by torch's own
pipeline schedules (``torch.distributed.pipelining``), to compare simtrain's pipeline engine with.

Each rank builds the same ``LlamaForCausalLM`` (``calibration.realstep.build_model``, one seed) and keeps its
stage: stage 0 the token embedding and the first layers, the last stage the last layers, the final norm,
the LM head and transformers' own causal-LM loss (``loss_function``); each stage holds as many layers as
simtrain's layout gives it (``stage_layers``). Each decoder layer is called the way
``LlamaModel.forward`` calls it (rotary embeddings and the causal mask made per stage, as that forward makes
them once). ``PipelineStage`` sends the activations and their gradients between stages (gloo on a CPU: one
``isend``/``irecv`` pair per micro-batch and direction), and torch's schedule of the same name as simtrain's
orders the micro-batches (``SCHEDULES``): ``Schedule1F1B``, ``ScheduleGPipe``, or, with ``--chunks`` model
chunks per rank placed where simtrain's route places them, ``ScheduleInterleaved1F1B`` (rank ``r`` holds
model stages ``r, r + p, ...``: Megatron's virtual stages, simtrain's ``layout.vpp``) or ``ScheduleDualPipeV``
(two chunks in a V: rank ``r`` holds model stages ``r`` and ``2p - 1 - r``). One step = the
schedule's ``step`` over ``--microbatches`` micro-batches, then ``AdamW.step()`` and ``zero_grad()`` on every
rank; its time is the slowest rank's, between barriers. Each rank's waits for its transfers are timed too
(``receive_waits``); the rest of its step is its busy time (``busy_s_per_rank``), which simtrain's trace gives
as the rank's compute stream.

    (started as ranks by ``calibration.launch.launch_local(..., module="calibration.realstep_pp")``)
    python -m calibration.realstep_pp --model-json spec.json --seq-len 256 --micro-batch-size 2 \\
        --microbatches 4 --schedule 1f1b --out result.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from calibration.realstep import build_model, run_rank, step_parser
from simtrain.lower.layer_plan import layers_by_position
from simtrain.plan.schedules import schedule_route
from simtrain.spec.model import ModelSpec

#: torch's schedule class (``torch.distributed.pipelining``) for each simtrain schedule name
#: (``layout.schedule``) this step runs. Both sides order the micro-batches alike: interleaved 1F1B's
#: warm-up is ``(v - 1) * p + 2 * (p - 1 - rank)`` forwards in groups of ``p`` micro-batches in torch's
#: ``ScheduleInterleaved1F1B`` and in Megatron's order that simtrain follows.
#: torch's ``ScheduleDualPipeV`` follows deepseek-ai/DualPipe's ``dualpipev.py`` as simtrain's ``dualpipev``
#: does; it runs each overlapped forward-and-backward pair's two halves one after the other (its runtime's
#: ``OVERLAP_F_B`` performs the sub-actions in turn), as one CPU thread must.
SCHEDULES: dict[str, str] = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe",
                             "interleaved_1f1b": "ScheduleInterleaved1F1B", "dualpipev": "ScheduleDualPipeV"}

#: Schedules that place several model chunks on each rank: ``--chunks`` under interleaved 1F1B (simtrain's
#: ``layout.vpp``), always two under DualPipeV (which simtrain's schedule places itself, ``layout.vpp`` 1).
CHUNKED = ("interleaved_1f1b", "dualpipev")


def chunks_of(schedule: str, chunks: int) -> int:
    """Model chunks per rank that ``schedule`` runs when ``chunks`` are asked for (``CHUNKED``)."""
    return 2 if schedule == "dualpipev" else chunks if schedule in CHUNKED else 1


def chunk_layers(n_layers: int, stages: int, chunks: int = 1, schedule: str = "1f1b") -> list[list[tuple[int, range]]]:
    """Per rank, per chunk: the model stage (its position on a micro-batch's path) and its decoder layers,
    where simtrain's layout puts them (``layers_by_position`` over the schedule's route: the first and last
    model stages, which also hold the embedding and the LM head, take fewer when the layers do not divide
    evenly; interleaved chunk ``c`` of rank ``r`` is model stage ``c * stages + r``)."""
    route = schedule_route(schedule, stages, max(2 * stages, stages * chunks), chunks)
    counts = layers_by_position(n_layers, route.length)
    starts = [sum(counts[:k]) for k in range(route.length)]
    return [[(k, range(starts[k], starts[k] + counts[k]))
             for k in (route.position(0, s, c) for c in range(chunks))] for s in range(stages)]


def stage_layers(n_layers: int, stages: int) -> list[range]:
    """The decoder layers of each stage with one chunk per rank (``chunk_layers``): the real step runs
    the layout simtrain simulates."""
    return [chunks[0][1] for chunks in chunk_layers(n_layers, stages)]


class LlamaStage(nn.Module):
    """One pipeline stage of a ``LlamaForCausalLM``: its layers, with the embedding on the first stage and
    the final norm and LM head on the last (the loss is the schedule's ``loss_fn``)."""

    def __init__(self, full: Any, layers: range, first: bool, last: bool):
        super().__init__()
        inner = full.model
        self.config = full.config
        self.embed_tokens = inner.embed_tokens if first else None
        self.layers = nn.ModuleList(inner.layers[i] for i in layers)
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if last else None
        self.lm_head = full.lm_head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.models.llama.modeling_llama import create_causal_mask

        hidden = self.embed_tokens(x) if self.embed_tokens is not None else x
        position_ids = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=None, cache=None,
                                  position_ids=position_ids)
        pos = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers:
            out = layer(hidden, attention_mask=mask, position_embeddings=pos, position_ids=position_ids)
            hidden = out[0] if isinstance(out, tuple) else out
        if self.norm is not None and self.lm_head is not None:
            hidden = self.lm_head(self.norm(hidden))
        return hidden


class WaitClock:
    """Seconds a rank spent waiting for its point-to-point transfers since the last ``reset`` (``seconds``);
    ``supported`` is False where this torch has no ``_wait_batch_p2p`` to time."""

    def __init__(self, supported: bool) -> None:
        self.supported = supported
        self.seconds = 0.0

    def reset(self) -> None:
        self.seconds = 0.0


@contextmanager
def receive_waits() -> Iterator[WaitClock]:
    """Time this process's waits inside torch's pipeline schedules: every schedule waits for its receives
    (and its sends) through ``torch.distributed.pipelining.schedules._wait_batch_p2p``, which is wrapped
    while the context is open and restored after. What is left of a rank's step is its own work (compute,
    the optimizer and the schedule's host time): its busy time, to compare with the compute stream of
    simtrain's trace."""
    from torch.distributed.pipelining import schedules

    orig = getattr(schedules, "_wait_batch_p2p", None)
    clock = WaitClock(orig is not None)
    if orig is None:
        yield clock
        return

    def timed(work: Any) -> None:
        t0 = time.perf_counter()
        orig(work)
        clock.seconds += time.perf_counter() - t0

    schedules._wait_batch_p2p = timed
    try:
        yield clock
    finally:
        schedules._wait_batch_p2p = orig


def train_steps(spec: ModelSpec, seq_len: int, micro_batch_size: int, microbatches: int, schedule: str,
                steps: int, warmup: int, device: torch.device, dtype: torch.dtype, chunks: int = 1) -> dict[str, Any]:
    """``warmup + steps`` pipeline steps of ``microbatches`` micro-batches on this rank's model chunks
    (inside an initialised process group whose ranks are the pipeline stages); the timed steps, the
    slowest rank's."""
    from torch.distributed import pipelining

    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: the real step runs {', '.join(SCHEDULES)}")
    chunks = chunks_of(schedule, chunks)
    rank, stages = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # the same full model on every rank: each keeps its own stage of it
    built, impl = build_model(spec, dtype, torch.device("cpu"))
    full: Any = built  # transformers' LlamaForCausalLM (its submodules, not nn.Module's generic attributes)
    if impl != "transformers.LlamaForCausalLM":
        raise RuntimeError("the pipeline step splits transformers' LlamaForCausalLM; transformers is not installed")
    n_model_stages = stages * chunks
    plan = chunk_layers(spec.n_layers, stages, chunks, schedule)
    mine = plan[rank]
    modules = [LlamaStage(full, layers, k == 0, k == n_model_stages - 1).to(device) for k, layers in mine]
    for m in modules:
        m.train()
    vocab = spec.vocab

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return full.loss_function(logits=logits, labels=labels, vocab_size=vocab)

    pipe = [pipelining.PipelineStage(m, k, n_model_stages, device) for m, (k, _) in zip(modules, mine, strict=True)]
    kind = getattr(pipelining, SCHEDULES[schedule])
    sched = kind(pipe if schedule in CHUNKED else pipe[0], n_microbatches=microbatches, loss_fn=loss_fn)
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    gen = torch.Generator().manual_seed(99)
    ids = torch.randint(0, vocab, (micro_batch_size * microbatches, seq_len), generator=gen).to(device)
    first, last = any(k == 0 for k, _ in mine), any(k == n_model_stages - 1 for k, _ in mine)
    times, waits = [], []
    with receive_waits() as clock:
        for _ in range(warmup + steps):
            dist.barrier()
            clock.reset()
            t0 = time.perf_counter()
            sched.step(*((ids,) if first else ()), **({"target": ids, "losses": []} if last else {}))
            opt.step()
            opt.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - t0)
            waits.append(clock.seconds)
    timed = torch.tensor(times[warmup:], dtype=torch.float64)
    dist.all_reduce(timed, op=dist.ReduceOp.MAX)
    step_times = timed.tolist()
    # each rank's own step and waits, per timed step: busy = own step - waits
    own = [statistics.median(waits[warmup:]),
           statistics.median(t - w for t, w in zip(times[warmup:], waits[warmup:], strict=True))]
    per_rank: list[Any] = [None] * stages
    dist.all_gather_object(per_rank, own)
    return {"implementation": f"{impl} split by torch.distributed.pipelining ({kind.__name__})",
            "step_times_s": step_times, "median_s": statistics.median(step_times), "stages": stages,
            "chunks": chunks, "microbatches": microbatches, "schedule": schedule, "threads": torch.get_num_threads(),
            "layers_per_stage": [sum(len(r) for _, r in c) for c in plan],
            "layers_per_chunk": [[len(r) for _, r in c] for c in plan],
            "wait_s_per_rank": [w for w, _ in per_rank] if clock.supported else None,
            "busy_s_per_rank": [b for _, b in per_rank] if clock.supported else None}


def _parser() -> argparse.ArgumentParser:
    p = step_parser("python -m calibration.realstep_pp", __doc__.split("\n\n")[0])
    p.add_argument("--microbatches", type=int, required=True, help="micro-batches per step")
    p.add_argument("--schedule", choices=tuple(SCHEDULES), default="1f1b")
    p.add_argument("--chunks", type=int, default=2,
                   help="model chunks per rank under interleaved_1f1b (simtrain's layout.vpp); dualpipev runs 2, "
                        "the others 1")
    return p


def main(argv: list[str] | None = None) -> int:
    """One stage (rank) of the real pipeline step; rank 0 writes the result JSON."""
    args = _parser().parse_args(argv)
    spec = ModelSpec.model_validate(json.loads(Path(args.model_json).read_text()))
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    return run_rank("calibration.realstep_pp", args.out, args.timeout_s, cpu, True,
                    lambda: train_steps(spec, args.seq_len, args.micro_batch_size, args.microbatches, args.schedule,
                                        args.steps, args.warmup, cpu, torch.float32, args.chunks))


if __name__ == "__main__":
    sys.exit(main())
