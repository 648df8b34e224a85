"""What a collective is: its kind (an enum) and its typed options, independent of how it runs.

Lowering builds these, the op IR carries them (``Op.coll``), and the algorithm registry
(``simtrain.cost.collective_algorithms``) reads them; nothing parses a kind out of a name. A kind's value is
the string NCCL/torch users know (``all_reduce``), so traces, JSON and calibrated profiles that print
or store kinds read as before.

This module imports nothing from simtrain: the IR, the cost tables and the planners all depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class CollectiveKind(StrEnum):
    """A communication pattern, named as nccl-tests and ``torch.distributed`` name it."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    """Measured by the calibration (``dist.broadcast``); simtrain's programs do not issue it."""
    SEND = "send"
    """Point to point (pipeline activations and gradients; ``collectives.plan_send``)."""
    RING_SHIFT = "ring_shift"
    """Every GPU of the group sends its whole buffer to the next one (ring attention's KV exchange:
    P2P send/recv pairs, Megatron-core p2p context parallelism)."""

    @classmethod
    def names(cls) -> str:
        """Every valid kind, comma separated (for error messages)."""
        return ", ".join(k.value for k in cls)


@dataclass(frozen=True, slots=True)
class NodeLimited:
    """Options of a deduplicated (DeepEP-style) MoE all-to-all: a token crosses the network once per
    remote node it is routed to and fans out over NVLink there (``collective_algorithms.NodeLimitedA2A``).

    Attributes:
        max_nodes: node-limited routing sends a token to at most this many nodes (DeepSeek-V3 sec. 3.2.2,
            expert groups = nodes); 0: unrestricted top-k routing.
        top_k: experts per token (the all-to-all carries ``top_k`` copies of each token).
        n_experts: routed experts spread evenly over the group's nodes (the hit probability of unrestricted
            routing, ``collective_algorithms.node_hit_probability``).
    """

    max_nodes: int
    top_k: int
    n_experts: int

    def __post_init__(self) -> None:
        if self.max_nodes < 0 or self.top_k < 1 or self.n_experts < 0:
            raise ValueError(f"NodeLimited needs max_nodes >= 0, top_k >= 1, n_experts >= 0; got {self}")


CollectiveOptions = NodeLimited
"""Every typed option set a collective may carry (a union as option kinds are added)."""

_OPTIONS_OF: dict[type, frozenset[CollectiveKind]] = {NodeLimited: frozenset({CollectiveKind.ALL_TO_ALL})}


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective as the program issues it: its kind and, for some kinds, typed options.

    ``str()`` is its label in op names and traces: the kind's value, and ``.node_limited`` for the
    deduplicated all-to-all.
    """

    kind: CollectiveKind
    options: CollectiveOptions | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, CollectiveKind):
            object.__setattr__(self, "kind", CollectiveKind(self.kind))  # ValueError names a bad kind
        if self.options is not None and self.kind not in _OPTIONS_OF[type(self.options)]:
            raise ValueError(f"{type(self.options).__name__} options do not apply to a {self.kind.value}")

    @staticmethod
    def of(coll: Collective | CollectiveKind | str) -> Collective:
        """``coll`` as a Collective (a bare kind, or its string value, has no options)."""
        return coll if isinstance(coll, Collective) else Collective(CollectiveKind(coll))

    @property
    def node_limited(self) -> NodeLimited | None:
        """The deduplicated all-to-all's options, if this is one."""
        return self.options if isinstance(self.options, NodeLimited) else None

    def __str__(self) -> str:
        return f"{self.kind.value}.node_limited" if self.node_limited is not None else self.kind.value


#: The option-free collectives, as lowering and the blocks issue them.
ALL_REDUCE: Final = Collective(CollectiveKind.ALL_REDUCE)
ALL_GATHER: Final = Collective(CollectiveKind.ALL_GATHER)
REDUCE_SCATTER: Final = Collective(CollectiveKind.REDUCE_SCATTER)
ALL_TO_ALL: Final = Collective(CollectiveKind.ALL_TO_ALL)
SEND: Final = Collective(CollectiveKind.SEND)
RING_SHIFT: Final = Collective(CollectiveKind.RING_SHIFT)
