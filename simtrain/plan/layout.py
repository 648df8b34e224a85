"""The rank grid: coordinates of every rank on every mesh axis, process groups and placement.

One numpy reshape gives the grid (the nanotron/torchtitan approach): ranks are numbered with the
first axis of ``order`` varying fastest, so with TP innermost a TP group is consecutive ranks and
lands inside one NVLink node. EP is not its own grid axis: as in torchtitan and Megatron-core it
folds over the tp x cp x dp ranks of a pipeline stage, as Megatron-core's expert rank generator
does (``parallel_state.initialize_model_parallel``, expert mesh "tp-ep-dp-pp"): in a stage's ranks in
ascending order, ``etp`` consecutive ranks form an expert-tensor group, ``ep`` of those blocks (stride
``etp``) an EP group, and the ranks at the same place in every EP block an expert-data (``edp``) group.
Placement maps rank r to GPU r (nodes filled in rank order).
"""

from __future__ import annotations

import numpy as np

from simtrain.spec.config import LayoutConfig

GRID_AXES = ("tp", "cp", "dp", "pp")


class RankGrid:
    """Rank <-> coordinate math for a layout. Construction only records degrees and strides."""

    def __init__(self, layout: LayoutConfig):
        self.layout = layout
        self.order: tuple[str, ...] = tuple(a for a in layout.order if a in GRID_AXES)
        """Grid axes innermost first (``ep`` dropped: it folds over dp x cp)."""
        self._degree = {a: int(getattr(layout, a)) for a in GRID_AXES}
        self._stride: dict[str, int] = {}
        self._stage_ranks: dict[int, list[int]] = {}
        self._groups: dict[tuple[str, int], tuple[int, ...]] = {}
        s = 1
        for a in self.order:
            self._stride[a] = s
            s *= self._degree[a]

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self.layout.world_size

    def degree(self, axis: str) -> int:
        """Degree of a mesh axis."""
        return self._degree[axis]

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis``."""
        return self._stride[axis]

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank`` on every grid axis."""
        return {a: (rank // self.stride(a)) % self.degree(a) for a in self.order}

    def rank_of(self, **coords: int) -> int:
        """Rank at the given coordinates (missing axes are 0)."""
        return sum(coords.get(a, 0) * self.stride(a) for a in self.order)

    def stage_of(self, rank: int) -> int:
        """Pipeline stage of ``rank``."""
        return (rank // self.stride("pp")) % self.layout.pp

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """Ranks of ``rank``'s process group on ``axis`` (tp, cp, dp, pp, ep, dp_shard, dp_replicate, dp_cp,
        pp_emb). Memoised for every member at once (groups partition the ranks; one tuple shared), so
        full mode's per-rank lookups cost O(1) instead of O(group) or O(stage) each."""
        key = (axis, rank)
        hit = self._groups.get(key)
        if hit is None:
            hit = self._group(axis, rank)
            for r in hit:
                self._groups[(axis, r)] = hit
            self._groups[key] = hit  # pp_emb: a rank outside the embedding group is its own group
        return hit

    def _group(self, axis: str, rank: int) -> tuple[int, ...]:
        if axis in GRID_AXES:
            base = rank - self.coords(rank)[axis] * self.stride(axis)
            return tuple(base + i * self.stride(axis) for i in range(self.degree(axis)))
        if axis in ("dp_shard", "dp_replicate", "dp_cp"):
            return self._folded_group(axis, rank)
        if axis in ("etp", "ep", "edp"):
            return self._expert_group(axis, rank)
        if axis == "pp_emb":
            return self._embedding_group(rank)
        raise KeyError(axis)

    def _embedding_group(self, rank: int) -> tuple[int, ...]:
        """Megatron's embedding group: the first and the last pipeline stage's ranks at ``rank``'s
        other coordinates, which hold the input embedding and the weight shared with it (tied LM head,
        MTP); any other rank is alone."""
        c = self.coords(rank)
        ends = (self.rank_of(**{**c, "pp": 0}), self.rank_of(**{**c, "pp": self.layout.pp - 1}))
        return ends if rank in ends and ends[0] != ends[1] else (rank,)

    @property
    def etp(self) -> int:
        """Expert tensor-parallel degree (``layout.etp``, default tp as in Megatron)."""
        return self.layout.expert_tp

    def _expert_group(self, axis: str, rank: int) -> tuple[int, ...]:
        """Expert-tensor, expert-parallel and expert-data groups of ``rank`` (module docstring)."""
        members = self.stage_ranks(self.stage_of(rank))
        j = members.index(rank)
        etp, ep = self.etp, self.layout.ep
        if axis == "etp":
            start = j - j % etp
            return tuple(members[start:start + etp])
        if axis == "ep":
            block = etp * ep
            start = j - j % block + j % etp
            return tuple(members[start:start - start % block + block:etp])
        return tuple(members[j % (etp * ep)::etp * ep])

    def _folded_group(self, axis: str, rank: int) -> tuple[int, ...]:
        """Groups carved out of the dp x cp plane (EP) or the dp axis (hybrid-shard FSDP)."""
        members = self.group("dp", rank) if axis in ("dp_shard", "dp_replicate") else self._dpcp_plane(rank)
        size = len(members) if axis == "dp_cp" else self.shard_size
        if axis == "dp_replicate":
            pos = members.index(rank) % size
            return tuple(members[pos::size])
        pos = members.index(rank) // size
        return tuple(members[pos * size:(pos + 1) * size])

    def _dpcp_plane(self, rank: int) -> tuple[int, ...]:
        c = self.coords(rank)
        return tuple(sorted(self.rank_of(tp=c["tp"], pp=c["pp"], dp=d, cp=k)
                            for d in range(self.layout.dp) for k in range(self.layout.cp)))

    @property
    def shard_size(self) -> int:
        """Size of the parameter-sharding group (dp, or fsdp_shard_size for hybrid shard)."""
        if self.layout.fsdp == "hybrid" and self.layout.fsdp_shard_size:
            return self.layout.fsdp_shard_size
        return self.layout.dp

    def groups(self, axis: str) -> list[tuple[int, ...]]:
        """Every group of ``axis``: a partition of all ranks."""
        seen: set[int] = set()
        out = []
        for r in range(self.world_size):
            if r not in seen:
                g = self.group(axis, r)
                seen.update(g)
                out.append(g)
        return out

    def stage_ranks(self, stage: int) -> list[int]:
        """All ranks of pipeline stage ``stage`` (ascending; memoised, as expert groups look them up)."""
        hit = self._stage_ranks.get(stage)
        if hit is None:
            ranks = np.arange(self.world_size)
            hit = self._stage_ranks[stage] = [int(r) for r in ranks[(ranks // self.stride("pp")) % self.layout.pp
                                                                    == stage]]
        return hit

    def stage_groups(self, axis: str, stage: int) -> list[tuple[int, ...]]:
        """The groups of ``axis`` whose members are in ``stage`` (a partition of its ranks)."""
        if axis not in GRID_AXES:
            seen: set[int] = set()
            out = []
            for r in self.stage_ranks(stage):
                if r not in seen:
                    g = self.group(axis, r)
                    seen.update(g)
                    out.append(g)
            return out
        t = self.table()  # axes outermost first
        pos = {a: i for i, a in enumerate(reversed(self.order))}
        sub = np.take(t, stage, axis=pos["pp"]) if axis != "pp" else t
        order_wo_pp = [a for a in reversed(self.order) if a != "pp" or axis == "pp"]
        sub = np.moveaxis(sub, order_wo_pp.index(axis), -1)
        return [tuple(int(x) for x in row) for row in sub.reshape(-1, self.degree(axis))]

    def representative(self, stage: int) -> int:
        """The rank simulated for ``stage`` in symmetric mode (all other coordinates 0)."""
        return self.rank_of(pp=stage)

    def table(self) -> np.ndarray:
        """Ranks as an array indexed by the axes outermost first (one numpy reshape)."""
        shape = tuple(self.degree(a) for a in reversed(self.order))
        return np.arange(self.world_size).reshape(shape)


def place(rank: int) -> int:
    """GPU index that hosts ``rank`` (ranks fill nodes in order, as torchrun assigns them)."""
    return rank
