"""Where a run's fabric comes from: :func:`fabric_of`, the one function simulate, run, sweep, search,
critical_path and validate build their ``Fabric`` with.

- ``hardware.fabric.kind: rail_optimised`` (the default): ``Topology``, the closed-form compile of
  ``build_graph`` (no graph in memory; what simtrain has always simulated).
- ``kind: graph`` (a GraphML or node-link JSON file): ``GraphTopology`` over the file's graph, checked
  against the schema (``simtrain.hardware.fabric.schema``). Files are read once per (path, size,
  modification time, cluster): a sweep over one graph file does not re-read it.
- any other kind: ``GraphTopology`` over the graph its builder returns (``builders.build_fabric``).
- a graph given in Python (``simulate(cfg, fabric=G)``): ``GraphTopology`` over it, checked.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import networkx as nx

from simtrain.hardware.fabric.builders import build_fabric
from simtrain.hardware.fabric.protocol import Fabric
from simtrain.hardware.fabric.routing import GraphTopology
from simtrain.hardware.fabric.schema import checked, load_graph
from simtrain.hardware.hardware import ClusterSpec
from simtrain.hardware.topology import Topology
from simtrain.spec.fabric_spec import FabricSpec, GraphFileFabric, RailOptimisedFabric

#: Graph files kept compiled (most recent first out): a sweep re-simulates one fabric many times.
FILE_CACHE = 4

_files: OrderedDict[tuple[str, int, int, ClusterSpec], GraphTopology] = OrderedDict()


def fabric_of(spec: FabricSpec, cluster: ClusterSpec, graph: nx.Graph | None = None) -> Fabric:
    """The ``Fabric`` of ``hardware.fabric`` = ``spec`` for ``cluster``, or of ``graph`` when one is given.

    Raises ConfigError for a graph file that cannot be read or a graph that breaks the schema.
    """
    if graph is not None:
        return GraphTopology(checked(graph, cluster, "fabric"), cluster)
    if isinstance(spec, RailOptimisedFabric):
        return Topology(cluster)
    if isinstance(spec, GraphFileFabric):
        return _graph_file(spec.path, cluster)
    return GraphTopology(checked(build_fabric(spec, cluster), cluster), cluster)


def _graph_file(path: str, cluster: ClusterSpec) -> GraphTopology:
    p = Path(path)
    try:
        st = p.stat()
        key: tuple[str, int, int, ClusterSpec] | None = (str(p.resolve()), st.st_size, st.st_mtime_ns, cluster)
        hash(key)
    except (OSError, TypeError):
        key = None  # a missing file: load_graph says why; an unhashable (calibrated) cluster: not cached
    if key is not None and key in _files:
        _files.move_to_end(key)
        return _files[key]
    graph = checked(load_graph(path, "hardware.fabric.path"), cluster, f"hardware.fabric ({path})", copy=False)
    topo = GraphTopology(graph, cluster)
    if key is not None:
        _files[key] = topo
        if len(_files) > FILE_CACHE:
            _files.popitem(last=False)
    return topo
