"""Routing tables compiled from a fabric graph: :class:`GraphTopology`, a ``Fabric`` over any graph of the
schema in ``simtrain.hardware.fabric.schema``.

Route choice (deterministic; the same graph gives the same routes on every machine and run):

1. Shortest by hop count. A route never transits a GPU vertex: it leaves the source GPU to a switch
   vertex (NVSwitch, NIC, leaf, ...) or goes straight to the destination over a direct GPU-GPU edge
   (a mesh node), and only enters a GPU at its end.
2. Among the shortest, the widest: the highest bottleneck ``bandwidth_Bps`` (so two GPUs of a node whose
   NIC is shared use NVLink through the NVSwitch, not PCIe through the NIC: both are two hops).
3. Among the shortest widest, ECMP: at each hop the next vertex is picked from the equal candidates
   (sorted by vertex name) by a hash of (source GPU, destination GPU, hop index) -- a splitmix64 mix,
   not Python's salted ``hash`` -- so the flows between different pairs spread over parallel spines or
   planes while each pair always takes one path.

Tables are computed lazily, per destination: one reverse breadth-first search over the switch graph (the
graph without its GPU vertices) from the destination GPU's entry switches gives every switch's hop count
and widest bottleneck to it; a route is then a walk down that table. The search skips *pendant* switches
(at most one neighbouring switch, e.g. a NIC under one leaf, an NVSwitch): no shortest route transits
one (it would leave the way it came), so a pendant switch is only ever a route's first or last switch and
its entry is derived from its neighbour's when a route starts there. On a fat tree the search so visits
only the leaves and spines (a few hundred vertices at 16,384 GPUs). Destinations whose entry switches
and entry bandwidths are the same share one table; the most recent :data:`TABLE_CACHE` tables are kept
(no all-pairs tables), and routes are memoised per pair by the comm planner.
"""

from __future__ import annotations

from collections import OrderedDict

import networkx as nx

from simtrain.hardware.hardware import ClusterSpec
from simtrain.hardware.topology import EdgeAttrs, Topology, build_graph
from simtrain.spec.errors import ConfigError, problem

#: Destination routing tables kept (least recently used dropped first); each holds the core switches.
TABLE_CACHE = 4096

_MASK = (1 << 64) - 1


def ecmp_index(src: int, dst: int, hop: int, n: int) -> int:
    """Which of ``n`` equal-cost next hops the route ``src -> dst`` takes at hop ``hop`` (0-based): a
    splitmix64 finaliser of the three ints, modulo ``n``. Deterministic across processes."""
    x = (src * 0x9E3779B97F4A7C15 + dst * 0xC2B2AE3D27D4EB4F + hop * 0x165667B19E3779F9) & _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    x ^= x >> 31
    return x % n


class _Table:
    """One destination's routing table over the core of the switch graph: ``dist[i]`` hops from switch
    ``i`` to the destination's entry switches, ``width[i]`` the widest bottleneck (bytes/s) of a shortest
    route from switch ``i`` into the destination GPU; switches absent are unreachable or pendant.
    ``next[i]``: the equal next hops from ``i`` (memoised by the route walk). ``up``: the table this one
    was derived from (one hop nearer the source), whose next hops it shares beyond the first hop."""

    __slots__ = ("dist", "width", "next", "up")

    def __init__(self, dist: dict[int, int], width: dict[int, float], up: _Table | None = None):
        self.dist, self.width, self.up = dist, width, up
        self.next: dict[int, list[int]] = {}


class GraphTopology:
    """A ``Fabric`` over a fabric graph (``networkx.DiGraph``; an undirected graph means full duplex).

    Args:
        graph: the fabric, in the schema of ``simtrain.hardware.fabric.schema`` (not checked here:
            ``schema.checked`` does that, and ``fabric_of`` calls it).
        cluster: the cluster the graph's GPUs belong to (GPU spec, NCCL latency terms). Only route and
            edge queries work without it.
    """

    def __init__(self, graph: nx.DiGraph, cluster: ClusterSpec | None = None):
        g = graph if graph.is_directed() else graph.to_directed()
        self.graph: nx.DiGraph = g
        self._cluster = cluster
        kinds = dict(g.nodes(data="kind"))
        gpus = sorted((int(v[3:]), v) for v, k in kinds.items() if k == "gpu")
        self._n_gpus = len(gpus)
        self._gpu_name = [v for _, v in gpus]
        self._node = [int(g.nodes[v]["node"]) for v in self._gpu_name]
        self._local = [int(g.nodes[v]["local"]) for v in self._gpu_name]
        switches = sorted(v for v, k in kinds.items() if k != "gpu")
        index = {v: i for i, v in enumerate(switches)}
        self._switches = switches
        self._index = index
        # switch graph, by index, successors sorted by name (the ECMP candidates' order)
        self._succ: list[list[tuple[int, float]]] = [[] for _ in switches]
        self._pred: list[list[tuple[int, float]]] = [[] for _ in switches]
        for u, v, bw in g.edges(data="bandwidth_Bps"):
            iu, iv = index.get(u), index.get(v)
            if iu is not None and iv is not None:
                self._succ[iu].append((iv, float(bw)))
                self._pred[iv].append((iu, float(bw)))
        for s in self._succ:
            s.sort()
        # pendant switches: at most one distinct neighbouring switch (either direction); never transited
        self._up: list[tuple[int, float] | None] = []
        self._core: list[bool] = []
        for i in range(len(switches)):
            nbrs = {j for j, _ in self._succ[i]} | {j for j, _ in self._pred[i]}
            nbrs.discard(i)
            self._core.append(len(nbrs) > 1)
            self._up.append(self._succ[i][0] if len(nbrs) <= 1 and self._succ[i] else None)
        self._core_pred = [[(u, bw) for u, bw in p if self._core[u]] for p in self._pred]
        # per GPU: switches it sends to, switches it receives from (with the edge bandwidths), GPUs it has
        # a direct edge to
        self._out: list[list[tuple[int, float]]] = []
        self._in: list[tuple[tuple[int, float], ...]] = []
        self._direct: list[set[str]] = []
        for v in self._gpu_name:
            self._out.append(sorted((index[w], float(d["bandwidth_Bps"])) for w, d in g.adj[v].items()
                                    if w in index))
            self._in.append(tuple(sorted((index[u], float(d["bandwidth_Bps"])) for u, d in g.pred[v].items()
                                         if u in index)))
            self._direct.append({w for w in g.adj[v] if w not in index})
        nic = [min((w for w in g.adj[v] if kinds.get(w) == "nic"), default=None) for v in self._gpu_name]
        self._nic = nic
        self._rail = [int(g.nodes[n].get("rail", 0)) if n is not None else 0 for n in nic]
        self._nvsw: dict[int, str] = {}
        for v, k in kinds.items():
            if k == "nvswitch" and "node" in g.nodes[v]:
                self._nvsw.setdefault(int(g.nodes[v]["node"]), v)
        nodes = sorted(set(self._node))
        self._n_nodes = len(nodes)
        per_node: dict[int, int] = {}
        for n in self._node:
            per_node[n] = per_node.get(n, 0) + 1
        self._gpus_per_node = max(per_node.values(), default=0)
        nics: dict[int, int] = {}
        for v, k in kinds.items():
            if k == "nic":
                n = int(g.nodes[v].get("node", -1))
                nics[n] = nics.get(n, 0) + 1
        self._nics_per_node = max(nics.values(), default=0)
        self._mesh = not self._nvsw and any(self._direct)
        self._tables: OrderedDict[tuple[tuple[int, float], ...], _Table] = OrderedDict()
        self._edges: dict[tuple[str, str], EdgeAttrs] = {}
        self._rail_symmetric: bool | None = None

    # -- sizes and coordinates ------------------------------------------------------------------------
    @property
    def cluster(self) -> ClusterSpec:
        """The cluster of this fabric (ValueError if the GraphTopology was built without one)."""
        if self._cluster is None:
            raise ValueError("this GraphTopology was built without a cluster (GraphTopology(graph, cluster))")
        return self._cluster

    @property
    def n_gpus(self) -> int:
        """GPU vertices in the graph."""
        return self._n_gpus

    @property
    def n_nodes(self) -> int:
        """Distinct ``node`` attributes of the GPUs."""
        return self._n_nodes

    @property
    def gpus_per_node(self) -> int:
        """GPUs in the largest node."""
        return self._gpus_per_node

    @property
    def nics_per_node(self) -> int:
        """NIC vertices of the node with the most."""
        return self._nics_per_node

    @property
    def mesh(self) -> bool:
        """No NVSwitch vertex, and GPU-GPU edges."""
        return self._mesh

    @property
    def rail_symmetric(self) -> bool:
        """Whether the graph is ``build_graph(cluster)`` (same vertices, kinds, edges and edge attributes):
        then symmetric mode may use the rail-optimised fabric's shortcuts (``Fabric.rail_symmetric``)."""
        if self._rail_symmetric is None:
            self._rail_symmetric = self._cluster is not None and same_fabric(self.graph, build_graph(self._cluster))
        return self._rail_symmetric

    @property
    def nodes_per_leaf(self) -> int:
        """The cluster's nodes per leaf group on a rail-symmetric graph; else all nodes (one group)."""
        return self.cluster.nodes_per_leaf if self.rail_symmetric else max(self._n_nodes, 1)

    def leaf_group_of_node(self, node: int) -> int:
        """``node // nodes_per_leaf``."""
        return node // self.nodes_per_leaf

    def node_of(self, gpu: int) -> int:
        """The ``node`` attribute of ``gpu``."""
        return self._node[gpu]

    def local_of(self, gpu: int) -> int:
        """The ``local`` attribute of ``gpu``."""
        return self._local[gpu]

    def rail_of(self, gpu: int) -> int:
        """The ``rail`` of the NIC ``gpu`` uses (0 without a NIC)."""
        return self._rail[gpu]

    def nic_of(self, gpu: int) -> str:
        """The NIC vertex ``gpu`` has an edge to (the first by name if several); KeyError if none."""
        nic = self._nic[gpu]
        if nic is None:
            raise KeyError(f"gpu{gpu} has no edge to a NIC")
        return nic

    def nvswitch_of(self, node: int) -> str | None:
        """The NVSwitch vertex whose ``node`` attribute is ``node`` (None if there is none)."""
        return self._nvsw.get(node)

    # -- routes ---------------------------------------------------------------------------------------
    def route(self, src: int, dst: int) -> tuple[tuple[str, str], ...]:
        """Directed edges of the route from GPU ``src`` to GPU ``dst`` (module docstring: shortest,
        widest, ECMP); empty when ``src == dst``. ConfigError if the graph has no route."""
        if not (0 <= src < self._n_gpus and 0 <= dst < self._n_gpus):
            raise IndexError(f"gpu {src} or {dst} out of range 0..{self._n_gpus - 1}")
        if src == dst:
            return ()
        gs, gd = self._gpu_name[src], self._gpu_name[dst]
        if gd in self._direct[src]:
            return ((gs, gd),)
        table = self._table(dst)
        dist, width, names = table.dist, table.width, self._switches
        best_d, best_w, cands = -1, -1.0, []
        for i, bw in self._out[src]:
            d, wi = self._lookup(table, i)
            if d < 0:
                continue
            w = min(bw, wi)
            if best_d < 0 or d < best_d or (d == best_d and w > best_w):
                best_d, best_w, cands = d, w, [i]
            elif d == best_d and w == best_w:
                cands.append(i)
        if not cands:
            raise ConfigError(problem("hardware.fabric", f"{gs} -> {gd}",
                                      "a fabric with a route between every two GPUs (one that transits no GPU)"))
        cur = cands[ecmp_index(src, dst, 0, len(cands))] if len(cands) > 1 else cands[0]
        path = [(gs, names[cur])]
        hop = 1
        if cur not in dist:  # a pendant first switch: on to its one neighbour
            j = self._up[cur][0]  # type: ignore[index]
            path.append((names[cur], names[j]))
            cur, hop = j, hop + 1
        while (d := dist[cur]) > 0:
            # beyond the first hop a derived table's next hops are its parent's (no entry is d - 1 away)
            t = table.up if table.up is not None and d >= 2 else table
            nxt = t.next.get(cur)
            if nxt is None:
                want_w = width[cur]
                nxt = t.next[cur] = [j for j, bw in self._succ[cur]
                                     if dist.get(j) == d - 1 and min(bw, width[j]) == want_w]
            j = nxt[ecmp_index(src, dst, hop, len(nxt))] if len(nxt) > 1 else nxt[0]
            path.append((names[cur], names[j]))
            cur, hop = j, hop + 1
        path.append((names[cur], gd))
        return tuple(path)

    def _table(self, dst: int) -> _Table:
        return self._table_for(self._in[dst])

    def _table_for(self, entries: tuple[tuple[int, float], ...]) -> _Table:
        """The table of an entry set (switch, bandwidth into the destination), cached. When every entry is
        pendant and their predecessors are core switches, the table is derived from the predecessors'
        (one hop further; they are shared by many destinations, e.g. a leaf by the GPUs of its rail),
        else it is searched."""
        t = self._tables.get(entries)
        if t is not None:
            self._tables.move_to_end(entries)
            return t
        lifted: dict[int, float] = {}
        if entries and not any(self._core[i] for i, _ in entries):
            for i, w in entries:
                for u, bw in self._pred[i]:
                    lifted[u] = max(lifted.get(u, 0.0), min(bw, w))
        if lifted and all(self._core[u] for u in lifted):
            up = self._table_for(tuple(sorted(lifted.items())))
            dist = {k: v + 1 for k, v in up.dist.items()}
            width = dict(up.width)
            for i, w in entries:
                dist[i], width[i] = 0, w
            t = _Table(dist, width, up)
        else:
            t = self._bfs(entries)
        self._tables[entries] = t
        if len(self._tables) > TABLE_CACHE:
            self._tables.popitem(last=False)
        return t

    def _lookup(self, table: _Table, i: int) -> tuple[int, float]:
        """(hops, widest bottleneck) from switch ``i`` into the table's destination; hops -1: none."""
        d = table.dist.get(i)
        if d is not None:
            return d, table.width[i]
        up = self._up[i]
        if up is None or up[0] not in table.dist:
            return -1, 0.0
        j, bw = up
        return table.dist[j] + 1, min(bw, table.width[j])

    def _bfs(self, entries: tuple[tuple[int, float], ...]) -> _Table:
        """Level-by-level reverse BFS over the core switches from the entry switches; each level's widths
        from the level below."""
        dist: dict[int, int] = {}
        width: dict[int, float] = {}
        level = []
        for i, bw in entries:
            if i not in dist:
                dist[i] = 0
                level.append(i)
            width[i] = max(width.get(i, 0.0), bw)
        pred = self._core_pred
        d = 0
        while level:
            d += 1
            nxt = []
            for v in level:
                wv = width[v]
                for u, bw in pred[v]:
                    du = dist.get(u)
                    if du is None:
                        dist[u], width[u] = d, min(bw, wv)
                        nxt.append(u)
                    elif du == d:
                        width[u] = max(width[u], min(bw, wv))
            level = nxt
        return _Table(dist, width)

    # -- edges ----------------------------------------------------------------------------------------
    def edge(self, u: str, v: str) -> EdgeAttrs:
        """Attributes of the directed edge ``u -> v``; KeyError if there is no such edge."""
        key = (u, v)
        e = self._edges.get(key)
        if e is None:
            d = self.graph.adj[u][v]
            e = self._edges[key] = EdgeAttrs(float(d["bandwidth_Bps"]), float(d["latency_s"]), d["link_class"])
        return e

    path_latency_s = Topology.path_latency_s
    path_bandwidth_Bps = Topology.path_bandwidth_Bps
    link_class_of = Topology.link_class_of


def same_fabric(a: nx.DiGraph, b: nx.DiGraph) -> bool:
    """Whether two fabric graphs have the same vertices with the same kind (and GPU ``node``/``local``),
    and the same directed edges with equal ``bandwidth_Bps``, ``latency_s`` and ``link_class``."""
    if a.number_of_nodes() != b.number_of_nodes() or a.number_of_edges() != b.number_of_edges():
        return False
    if a._adj == b._adj and a._node == b._node:  # networkx's own dicts: compared at C speed
        return True  # the usual case (a file written from build_graph)
    for v, d in b.nodes(data=True):
        if v not in a:
            return False
        da = a.nodes[v]
        if da.get("kind") != d.get("kind"):
            return False
        if d.get("kind") == "gpu" and (da.get("node") != d.get("node") or da.get("local") != d.get("local")):
            return False
    keys = ("bandwidth_Bps", "latency_s", "link_class")
    adj = a.adj
    for u, v, d in b.edges(data=True):
        da = adj[u].get(v)
        if da is None or any(da.get(k) != d[k] for k in keys):
            return False
    return True

