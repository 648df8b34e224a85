"""What torch DTensor tensor parallelism with sequence parallelism saves for backward (2 gloo ranks, CPU).

A torchtitan-style feed-forward block: RMSNorm under ``SequenceParallel``, its output gathered once to
``Replicate`` by ``PrepareModuleInput`` (torchtitan's ``feed_forward`` plan), column-parallel w1 and w3,
row-parallel w2 reduce-scattered back to the sequence shard. Rank 0 prints, as JSON, the element count
of every unique storage autograd saved inside the feed-forward module (parameters excluded).
Run: ``python dtensor_sp_probe.py B S H F``.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

WORLD = 2


class FeedForward(torch.nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.w1 = torch.nn.Linear(h, f, bias=False)
        self.w3 = torch.nn.Linear(h, f, bias=False)
        self.w2 = torch.nn.Linear(f, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.ffn_norm = torch.nn.RMSNorm(h)
        self.feed_forward = FeedForward(h, f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.feed_forward(self.ffn_norm(x))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def worker(rank: int, port: int, dims: tuple[int, int, int, int]) -> None:
    b, s, h, f = dims
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    block = Block(h, f)
    parallelize_module(block, mesh, {
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    })
    params = {_local(p).untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict[int, int] = {}
    inside = [False]
    block.feed_forward.register_forward_pre_hook(lambda m, a: inside.__setitem__(0, True))
    block.feed_forward.register_forward_hook(lambda m, a, o: inside.__setitem__(0, False))

    def pack(t: torch.Tensor) -> torch.Tensor:
        local = _local(t)
        ptr = local.untyped_storage().data_ptr()
        if inside[0] and ptr and ptr not in params and ptr not in seen:
            seen[ptr] = local.untyped_storage().nbytes() // local.element_size()
        return t

    x = torch.randn(b, s // WORLD, h, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(DTensor.from_local(x, mesh, [Shard(1)]))
    _local(out).sum().backward()
    if rank == 0:
        print(json.dumps(sorted(seen.values())))
    dist.destroy_process_group()


def main() -> None:
    dims = tuple(int(a) for a in sys.argv[1:5])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(worker, args=(port, dims), nprocs=WORLD)


if __name__ == "__main__":
    main()
