"""The fabric graph schema, as code: what a cluster fabric graph must hold, its checks and its loaders.

A fabric is a ``networkx.DiGraph``; an undirected ``networkx.Graph`` (or a file that says
``edgedefault="undirected"`` / ``"directed": false``) means full duplex: both directions, same attributes.

Vertices (names are strings, unique):

- GPUs: named ``gpu{g}``, ``g`` = 0..n_gpus-1 the global GPU index (the rank placement index,
  ``simtrain.plan.layout.place``), with attributes ``kind="gpu"``, ``node`` (int, node index: the GPUs of
  a node share its scale-up domain and host) and ``local`` (int, index inside the node). GPU ``g`` is on
  node ``g // gpus_per_node`` at local index ``g % gpus_per_node``, every node has the same GPU count,
  and with a cluster that count and the GPU total are the hardware section's.
- Everything else: ``kind`` in :data:`SWITCH_KINDS` ("nvswitch", "nic", "leaf", "spine", "core",
  "gateway", "storage"). NICs carry ``node`` and ``rail`` (ints); an NVSwitch carries ``node`` (NVLink
  SHARP reduces there). Names are free (the built-in fabric's: ``nvsw{n}``, ``nic{n}.{j}``,
  ``leaf{j}.{k}``, ``spine``).

Edges (directed; attributes per direction):

- ``bandwidth_Bps``: float > 0, bytes per second in this direction;
- ``latency_s``: float >= 0, seconds per traversal;
- ``link_class``: "nvlink" (scale-up), "pcie" (GPU-NIC) or "net" (network): it picks the protocol
  efficiency (``GpuSpec.nvlink_efficiency`` / ``nic_efficiency``) and the NCCL latency terms.

Routes never transit a GPU (a GPU is only a route's first or last vertex), and every GPU must have a
route to every other. Routing itself is ``simtrain.hardware.fabric.routing``. Files: GraphML
(``networkx.write_graphml``) or networkx node-link JSON (``networkx.node_link_data``), at most
:data:`MAX_GRAPH_BYTES`. Every problem is a ``ConfigError`` naming ``hardware.fabric``, the vertex or
edge, the attribute, the value and what would be valid.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

import networkx as nx

from simtrain.hardware.hardware import ClusterSpec
from simtrain.spec.errors import ConfigError, Problem, problem

#: Kinds of the vertices that are not GPUs.
SWITCH_KINDS = ("nvswitch", "nic", "leaf", "spine", "core", "gateway", "storage")
#: Every vertex kind.
KINDS = ("gpu", *SWITCH_KINDS)
#: Edge link classes.
LINK_CLASSES = ("nvlink", "pcie", "net")
#: Largest graph file read (bytes): a 16,384-GPU rail-optimised fabric is ~21 MB of GraphML.
MAX_GRAPH_BYTES = 256 * 1024**2
#: Problems listed before the rest are counted (a broken 10^5-vertex file would list 10^5).
MAX_PROBLEMS = 20
#: Largest GPU count whose all-pairs reachability is checked pair by pair when the quick check fails.
EXACT_REACH_GPUS = 2048

_GPU_NAME = re.compile(r"gpu(0|[1-9][0-9]*)")
_WHERE = "hardware.fabric"


def load_graph(path: str | Path, where: str = _WHERE) -> nx.DiGraph:
    """Read a fabric graph file: GraphML (``.graphml``, ``.xml``) or node-link JSON (``.json``).

    Returns a directed graph (an undirected file becomes both directions). Raises ConfigError naming
    ``where`` and the path for a missing, oversized, unreadable or malformed file (not for schema
    problems: :func:`checked` finds those).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_GRAPH_BYTES:
            raise ConfigError(problem(where, str(path), f"a graph file of at most {MAX_GRAPH_BYTES} bytes "
                                                        f"(this one has {size})"))
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(problem(where, str(path), f"a readable graph file ({exc.strerror or exc})")) from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".json":
            graph = _from_node_link(json.loads(data))
        elif suffix in (".graphml", ".xml"):
            if b"<!ENTITY" in data or b"<!DOCTYPE" in data:  # GraphML needs neither; entities can expand
                raise ValueError("a DOCTYPE or ENTITY declaration (GraphML needs none)")
            graph = nx.parse_graphml(data.decode("utf-8"))
        else:
            raise ConfigError(problem(where, str(path), "a .graphml, .xml or .json graph file"))
    except ConfigError:
        raise
    except (ValueError, KeyError, TypeError, ParseError, nx.NetworkXError, UnicodeDecodeError) as exc:
        kind = "node-link JSON" if suffix == ".json" else "GraphML"
        raise ConfigError(problem(where, str(path), f"a well-formed {kind} file ({type(exc).__name__}: "
                                                    f"{str(exc)[:200]})")) from None
    if graph.is_multigraph():
        raise ConfigError(problem(where, str(path), "a graph without parallel edges (merge them into one edge "
                                                    "whose bandwidth_Bps is their sum)"))
    return graph if graph.is_directed() else graph.to_directed()


def _from_node_link(data: Any) -> nx.Graph:
    if not isinstance(data, dict):
        raise ValueError("the top level is not an object")
    key = "edges" if "edges" in data else "links"
    return nx.node_link_graph(data, edges=key)


def checked(graph: nx.Graph, cluster: ClusterSpec | None = None, where: str = _WHERE,
            copy: bool = True) -> nx.DiGraph:
    """``graph`` checked against the schema (module docstring), as a directed graph whose numeric
    attributes are Python ints and floats (GraphML from other tools may carry them as strings): a new
    graph, or ``graph`` itself when ``copy`` is False and it is directed (a graph just loaded).

    With ``cluster``, the GPU count and GPUs per node must be the hardware section's. Raises ConfigError
    listing every problem (the first :data:`MAX_PROBLEMS`, then a count).
    """
    if not isinstance(graph, nx.Graph) or graph.is_multigraph():
        raise ConfigError(problem(where, type(graph).__name__, "a networkx.DiGraph or Graph without parallel edges"))
    g: nx.DiGraph = (graph.copy() if copy else graph) if graph.is_directed() else graph.to_directed()
    probs: list[Problem] = []
    gpus: dict[int, str] = {}
    for v, d in g.nodes(data=True):
        at = f"{where}: vertex {v!r}"
        if not isinstance(v, str):
            probs.append(problem(at, v, "vertex names are strings"))
            continue
        kind = d.get("kind")
        if kind not in KINDS:
            probs.append(problem(f"{at}.kind", kind, f"one of {', '.join(KINDS)}"))
            continue
        if kind == "gpu":
            m = _GPU_NAME.fullmatch(v)
            if m is None:
                probs.append(problem(at, v, "a GPU vertex is named gpu{g}, g the global GPU index 0, 1, ..."))
                continue
            gpus[int(m.group(1))] = v
            for attr in ("node", "local"):
                _int_attr(d, attr, at, probs)
        elif kind == "nic":
            for attr in ("node", "rail"):
                _int_attr(d, attr, at, probs)
        elif kind == "nvswitch" and "node" in d:
            _int_attr(d, "node", at, probs)
    for u, v, d in g.edges(data=True):
        at = f"{where}: edge {u!r} -> {v!r}"
        bw = _number(d.get("bandwidth_Bps"))
        if bw is None or not (bw > 0 and math.isfinite(bw)):
            probs.append(problem(f"{at}.bandwidth_Bps", d.get("bandwidth_Bps"), "a finite number > 0 (bytes/s)"))
        else:
            d["bandwidth_Bps"] = bw
        lat = _number(d.get("latency_s"))
        if lat is None or not (lat >= 0 and math.isfinite(lat)):
            probs.append(problem(f"{at}.latency_s", d.get("latency_s"), "a finite number >= 0 (seconds)"))
        else:
            d["latency_s"] = lat
        if d.get("link_class") not in LINK_CLASSES:
            probs.append(problem(f"{at}.link_class", d.get("link_class"), f"one of {', '.join(LINK_CLASSES)}"))
    if not probs:
        _check_gpus(g, gpus, cluster, where, probs)
    if not probs:
        _check_routes(g, [gpus[i] for i in range(len(gpus))], where, probs)
    if probs:
        extra = len(probs) - MAX_PROBLEMS
        raise ConfigError(probs[:MAX_PROBLEMS] + ([Problem(where, f"... and {extra} more problems")] if extra > 0 else []))
    return g


def _number(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int | float):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def _int_attr(d: dict[str, Any], attr: str, at: str, probs: list[Problem]) -> None:
    x = d.get(attr)
    n = _number(x)
    if n is None or n != int(n) or n < 0:
        probs.append(problem(f"{at}.{attr}", x, "an integer >= 0"))
    else:
        d[attr] = int(n)


def _check_gpus(g: nx.DiGraph, gpus: dict[int, str], cluster: ClusterSpec | None, where: str,
                probs: list[Problem]) -> None:
    """GPU numbering 0..n-1 without gaps, equal nodes, g = node * gpus_per_node + local, the cluster's counts."""
    if not gpus:
        probs.append(Problem(where, "the graph has no GPU vertex (kind='gpu', named gpu0, gpu1, ...)"))
        return
    n = len(gpus)
    missing = [i for i in range(max(gpus) + 1) if i not in gpus]
    if missing:
        probs.append(problem(f"{where}: GPU numbering", f"gpu{missing[0]}", f"GPUs numbered 0..{n - 1} without gaps "
                                                                           f"({len(missing)} missing, first gpu{missing[0]})"))
        return
    per_node = Counter(g.nodes[gpus[i]]["node"] for i in range(n))
    counts = set(per_node.values())
    if len(counts) > 1:
        probs.append(Problem(f"{where}: GPU node attributes", f"nodes hold {min(counts)} to {max(counts)} GPUs; every "
                                                              "node must hold the same number"))
        return
    gpn = counts.pop()
    if sorted(per_node) != list(range(len(per_node))):
        probs.append(problem(f"{where}: GPU node attributes", sorted(per_node)[:8], f"nodes numbered 0..{len(per_node) - 1}"))
        return
    for i in range(n):
        d = g.nodes[gpus[i]]
        if (d["node"], d["local"]) != (i // gpn, i % gpn):
            probs.append(problem(f"{where}: vertex 'gpu{i}'", f"node={d['node']}, local={d['local']}",
                                 f"node={i // gpn}, local={i % gpn} (GPU g is on node g // {gpn} at local g % {gpn})"))
            if len(probs) > MAX_PROBLEMS:
                return
    if cluster is not None:
        if gpn != cluster.gpus_per_node:
            probs.append(problem(f"{where}: GPUs per node", gpn, f"{cluster.gpus_per_node}, the node profile's "
                                                                 f"({cluster.node.name}; hardware.gpus_per_node)"))
        if n != cluster.n_gpus:
            probs.append(problem(f"{where}: GPU count", n, f"{cluster.n_gpus}, the hardware section's "
                                                           f"({cluster.n_nodes} nodes x {cluster.gpus_per_node} GPUs)"))


def _check_routes(g: nx.DiGraph, gpus: list[str], where: str, probs: list[Problem]) -> None:
    """Every GPU has a route to every other that transits no GPU. Quick check: one strongly connected
    set of switches that every GPU sends into and receives from; else pair by pair (small graphs)."""
    is_gpu = set(gpus)
    sw = g.subgraph(v for v in g if v not in is_gpu)
    comp: dict[str, int] = {}
    for i, c in enumerate(nx.strongly_connected_components(sw)):
        for v in c:
            comp[v] = i
    outs = [{comp[w] for w in g.adj[v] if w not in is_gpu} for v in gpus]
    ins = [{comp[u] for u in g.pred[v] if u not in is_gpu} for v in gpus]
    common = Counter(c for s in outs for c in s).most_common(1)
    if common:
        core = common[0][0]
        if all(core in o for o in outs) and all(core in i for i in ins):
            return
    if len(gpus) > EXACT_REACH_GPUS:
        core = common[0][0] if common else -1
        bad = next(v for v, o, i in zip(gpus, outs, ins, strict=True) if core not in o or core not in i)
        probs.append(problem(f"{where}: vertex {bad!r}", bad, "a GPU with a route to every other GPU (this one has no "
                                                               "edge to or from the fabric's main switch set)"))
        return
    for b in gpus:
        entry = [u for u in g.pred[b] if u not in is_gpu]
        reach = set(entry)
        for u in entry:
            reach |= nx.ancestors(sw, u)
        for a in gpus:
            if a != b and b not in g.adj[a] and not any(w in reach for w in g.adj[a] if w not in is_gpu):
                probs.append(problem(f"{where}: {a} -> {b}", "no route", "a route between every two GPUs that "
                                                                          "transits no GPU"))
                return
