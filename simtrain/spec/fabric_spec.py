"""``hardware.fabric``: which network joins the nodes (issue 28).

A tagged union on ``kind``. ``rail_optimised`` (the default) is the fabric simtrain has always simulated:
a rail-optimised two-level fat tree built from the node profile and ``hardware.oversubscription`` /
``hardware.nodes_per_leaf`` (``simtrain.hardware.topology``). ``graph`` loads a user's graph from a file
(GraphML or node-link JSON; schema in ``simtrain.hardware.fabric``). Builders of other fabrics add their
own member to :data:`FabricSpec`.

In YAML and ``--set`` a fabric may be given as a bare string: a path ending in ``.graphml``, ``.xml`` or
``.json`` means ``{kind: graph, path: ...}``; any other string is a kind with its default parameters.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from simtrain.spec.limits import MAX_GPUS

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, use_attribute_docstrings=True)

#: File suffixes read as a graph file when ``hardware.fabric`` is a bare string.
GRAPH_SUFFIXES = (".graphml", ".xml", ".json")


#: Ports of the default leaf/spine switch: NVIDIA Quantum-2 QM9700, 64 x 400 Gb/s NDR ports (NVIDIA
#: QM9700 datasheet; the switch of the DGX H100 SuperPOD reference architecture). Also the source of
#: ``hardware.nodes_per_leaf``'s default 32 (half the ports down, non-blocking).
DEFAULT_RADIX = 64

#: GPUs of one GB200/GB300 NVL72 compute tray: 18 trays x (2 Grace + 4 Blackwell) = 72 GPUs per rack
#: (NVIDIA GB200 NVL72 product page; reference/hardware-collectives-memory.md Table A).
NVL72_GPUS_PER_TRAY = 4

#: Switches per tier a builder may be asked for (spines, cores): 10^4 is ten times the spines of the
#: largest published fabrics; beyond it a graph of leaves x spines edges would not fit in memory.
MAX_SWITCHES = 10**4

Ratio = Annotated[float, Field(ge=1.0, le=1e3)]


def _ratios(value: Any) -> Any:
    """A bare number is the leaf tier's ratio (higher tiers non-blocking)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [value]
    if isinstance(value, str):
        try:
            return [float(value)]
        except ValueError:
            return value
    return value


#: Oversubscription per tier, from the leaves up: ``[2, 1]`` = leaf-to-spine 2:1, spine-to-core 1:1; a
#: bare number is the leaf tier's. Each ratio is the tier's downlink capacity over its uplink capacity.
Ratios = Annotated[tuple[Ratio, ...], BeforeValidator(_ratios), Field(min_length=1, max_length=2)]


class _Clos(BaseModel):
    """Parameters every tree-shaped builder shares (tiers above the leaves)."""

    model_config = _STRICT
    tiers: Literal[2, 3] = 2
    """Switch tiers: 2 = leaf, spine; 3 = leaf, spine, core (leaves grouped into pods under their own
    spines, pods joined by the cores)."""
    oversubscription: Ratios | None = None
    """Per tier from the leaves up (a list of ``tiers - 1`` ratios, missing ones 1 = non-blocking); None:
    ``hardware.oversubscription`` for the leaf tier (default 1, a non-blocking fabric)."""
    n_spines: int | None = Field(None, ge=1, le=MAX_SWITCHES)
    """Spine switches (per pod when ``tiers`` is 3): every leaf has one uplink to every spine, each with
    ``1/n_spines`` of its uplink capacity, so routes spread over them (ECMP) and one can fail. None: one
    aggregated spine carrying the summed capacity (same step times while no link is perturbed)."""
    n_cores: int | None = Field(None, ge=1, le=MAX_SWITCHES)
    """Core switches (``tiers: 3``): every spine has one uplink to every core. None: one aggregated core."""
    radix: int = Field(DEFAULT_RADIX, ge=2, le=10**4)
    """Ports per switch; sizes what is not given: a leaf's down ports are ``radix * r / (r + 1)`` at
    ratio ``r``, a pod's leaves likewise from a spine's ports. Default 64 (QM9700, see DEFAULT_RADIX)."""

    def ratios(self, hardware_ratio: float) -> tuple[float, ...]:
        """Oversubscription of each tier from the leaves up (``tiers - 1`` values)."""
        given = self.oversubscription if self.oversubscription is not None else (hardware_ratio,)
        return tuple(given) + (1.0,) * (self.tiers - 1 - len(given))

    @model_validator(mode="after")
    def _check(self) -> _Clos:
        if self.oversubscription is not None and len(self.oversubscription) > self.tiers - 1:
            raise ValueError(
                f"oversubscription {list(self.oversubscription)} has {len(self.oversubscription)} ratios; "
                f"a {self.tiers}-tier fabric has {self.tiers - 1} (set tiers: 3 for two)"
            )
        if self.n_cores is not None and self.tiers == 2:
            raise ValueError(f"n_cores {self.n_cores} needs tiers: 3 (a 2-tier fabric has no cores)")
        return self


class RailOptimisedFabric(_Clos):
    """Today's fabric: NIC ``j`` of every node under a leaf group plugs into rail leaf ``j`` of that group
    (``hardware.nodes_per_leaf`` nodes per group); the leaves go up to the spines (with no parameter: one
    aggregated spine at ``hardware.oversubscription``, exactly ``simtrain.hardware.topology.build_graph``).
    NVIDIA DGX SuperPOD H100 reference architecture: rail-optimised, one leaf per GPU index."""

    kind: Literal["rail_optimised"] = "rail_optimised"
    """Fabric kind: the rail-optimised fat tree (the default)."""
    groups_per_pod: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Leaf groups under one pod's spines (``tiers: 3``); None: a spine's down ports (from ``radix``) over
    the rails."""

    def is_default(self) -> bool:
        """True when no parameter is given: the graph is ``build_graph(cluster)``, byte for byte."""
        return self == RailOptimisedFabric()


class FatTreeFabric(_Clos):
    """A plain (not rail-optimised) fat tree: every NIC of a node plugs into the node's leaf; leaves,
    spines and (3 tiers) cores above. Al-Fares et al., "A scalable, commodity data center network
    architecture" (SIGCOMM 2008) for the shape; the ratios make it oversubscribed."""

    kind: Literal["fat_tree"] = "fat_tree"
    """Fabric kind: a plain fat tree."""
    nodes_per_leaf: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Nodes under one leaf; None: as many as the leaf's down ports hold (``radix * r / (r + 1)`` over the
    NICs per node, at least 1): 4 nodes of 8 NICs on a 64-port leaf at 1:1."""
    leaves_per_pod: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Leaves under one pod's spines (``tiers: 3``); None: a spine's down ports from ``radix``."""


class MultiPlaneFabric(_Clos):
    """Each NIC rail in its own plane: plane ``j`` is a separate leaf/spine network of the NICs ``j`` of all
    nodes (``hardware.nodes_per_leaf`` per leaf), with no switch link between planes. Traffic between
    different rails crosses to the destination rail's NIC inside the node, over the scale-up domain (PXN,
    NCCL's ``NCCL_PXN_DISABLE=0`` default: a GPU hands its data to the peer GPU whose NIC is on the right
    rail). The graph models it as NVSwitch-to-NIC edges at the NIC's PCIe bandwidth, so routes never transit
    a GPU; a node with an Infinity-Fabric mesh (no NVSwitch) is refused."""

    kind: Literal["multi_plane"] = "multi_plane"
    """Fabric kind: one network per NIC rail."""
    groups_per_pod: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Leaves of a plane under one pod's spines (``tiers: 3``); None: from ``radix``."""


class NvlRacksFabric(_Clos):
    """NVL72-style rack domains (GB200/GB300): a node is a rack, one NVLink switch domain of ``gpus_per_node``
    GPUs in compute trays of ``gpus_per_tray``, each GPU with its own scale-out NIC. ``leaf: rail`` (NVIDIA's
    rail-optimised compute fabric): NIC ``i`` of every tray (its tray rail) of a group of racks plugs into
    rail leaf ``i`` of that group, so a rack feeds ``gpus_per_tray`` leaves with one NIC per tray each;
    ``leaf: rack``: one top-of-rack leaf per group of racks takes all their NICs."""

    kind: Literal["nvl_racks"] = "nvl_racks"
    """Fabric kind: NVL72-style rack domains."""
    gpus_per_tray: int = Field(NVL72_GPUS_PER_TRAY, ge=1, le=MAX_GPUS)
    """GPUs (and NICs) of one compute tray: 4 on GB200/GB300 NVL72 (NVL72_GPUS_PER_TRAY)."""
    leaf: Literal["rail", "rack"] = "rail"
    """Leaf placement: ``rail`` (one leaf per tray rail per rack group) or ``rack`` (top-of-rack)."""
    racks_per_leaf: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Racks under one leaf; None: as many as the leaf's down ports hold (at least 1): a 64-port leaf at
    1:1 has 32 down ports, one rack's 18 trays use 18 of them on a rail leaf."""
    groups_per_pod: int | None = Field(None, ge=1, le=MAX_GPUS)
    """Leaf groups under one pod's spines (``tiers: 3``); None: from ``radix``."""


def _kind_name(value: Any) -> Any:
    """A bare string is a kind with its default parameters."""
    return {"kind": value} if isinstance(value, str) else value


#: A fabric one site of a multi-site cluster can be.
SiteFabric = Annotated[
    RailOptimisedFabric | FatTreeFabric | MultiPlaneFabric | NvlRacksFabric,
    Field(discriminator="kind"),
    BeforeValidator(_kind_name),
]


class MultiSiteFabric(BaseModel):
    """Two or more data centres, each a fabric of its own (``site``), joined by inter-site links: every pair
    of sites by one link of ``link_Gbps`` each way and ``latency_ms``, between one gateway per site that
    every top-tier switch of the site reaches (at ``gateway_Gbps`` in all, default the summed inter-site
    bandwidth, so the inter-site link, not the gateway, limits). Nodes are split evenly across sites in
    index order, so with the default rank order (dp outermost) data parallelism is what crosses sites."""

    model_config = _STRICT
    kind: Literal["multi_site"] = "multi_site"
    """Fabric kind: two or more sites."""
    n_sites: int = Field(2, ge=2, le=1000)
    """Data centres; ``hardware.n_nodes`` must be a multiple of it."""
    site: SiteFabric = RailOptimisedFabric()
    """The fabric inside each site (its ``kind`` and parameters), built over ``n_nodes / n_sites`` nodes."""
    link_Gbps: float = Field(400.0, gt=0, le=1e9)
    """Bandwidth of the link joining two sites, Gbit/s in each direction. Default 400: one 400G ZR/ZR+
    coherent optical link (OIF 400ZR implementation agreement, 2020), the usual unit of DCI capacity."""
    gateway_Gbps: float | None = Field(None, gt=0, le=1e9)
    """Bandwidth between a site and its gateway, Gbit/s each way: the site's whole inter-site capacity, shared
    by its links to every other site (split evenly over the site's top-tier switches). None: not limiting
    (the sum of the site's links), so ``link_Gbps`` per site pair is what limits."""
    latency_ms: float = Field(1.0, ge=0, le=1e4)
    """One-way latency of the inter-site link, ms. Default 1: ~200 km of fibre at 5 us/km (light in glass
    at ~2/3 c), a metro-region pair of data centres."""


class GraphFileFabric(BaseModel):
    """A user's fabric graph read from a file (GraphML or networkx node-link JSON)."""

    model_config = _STRICT
    kind: Literal["graph"] = "graph"
    """Fabric kind: a graph file."""
    path: str
    """Path of the graph file; relative paths are relative to the working directory."""


def _coerce(value: Any) -> Any:
    """A bare string: a graph file path (by suffix) or a kind name with default parameters."""
    if isinstance(value, str):
        if value.lower().endswith(GRAPH_SUFFIXES):
            return {"kind": "graph", "path": value}
        return {"kind": value}
    return value


#: ``hardware.fabric``: one member per fabric kind, chosen by ``kind``.
FabricSpec = Annotated[
    RailOptimisedFabric
    | FatTreeFabric
    | MultiPlaneFabric
    | NvlRacksFabric
    | MultiSiteFabric
    | GraphFileFabric,
    Field(discriminator="kind"),
    BeforeValidator(_coerce),
]
