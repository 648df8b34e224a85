"""The one reader of the YAML and JSON simtrain is given: bounded in size, aliases and depth.

PyYAML's ``safe_load`` refuses arbitrary objects but not size: a few hundred bytes of nested aliases
(the "billion laughs" alias bomb) expand to ~10^9 nodes once anything walks them, and an anchor used
inside itself (``a: &a [*a]``) builds a list that contains itself. Here a document is composed into
its node graph first (which shares aliased nodes, so it stays as small as the text), its expanded
size, depth and cycles are counted without recursion, and only a document within
``simtrain.spec.limits`` is constructed. Every failure is a ``ConfigError`` naming the file or field.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from pathlib import Path
from typing import Any

import yaml

from simtrain.spec.errors import ConfigError, Problem
from simtrain.spec.limits import MAX_CONFIG_BYTES, MAX_YAML_DEPTH, MAX_YAML_NODES


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _expanded_problem(root: yaml.Node) -> str | None:
    """Why the document under ``root`` is too big once its aliases are expanded, or None.

    Iterative post-order walk: ``size[id]`` is a node's expanded node count, memoised, so a shared
    (aliased) node is walked once; a node met again while still open is a cycle (a recursive alias).
    """
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack[-1]
        key = id(node)
        if key in size:
            stack.pop()
            continue
        if depth > MAX_YAML_DEPTH:
            return f"nested deeper than {MAX_YAML_DEPTH} levels"
        kids = _children(node)
        if key not in open_nodes:
            open_nodes.add(key)
            for kid in kids:
                if id(kid) in open_nodes:
                    return "an alias refers to a node that contains it (a recursive alias)"
                if id(kid) not in size:
                    stack.append((kid, depth + 1))
            continue
        stack.pop()
        open_nodes.discard(key)
        size[key] = 1 + sum(size[id(kid)] for kid in kids)
        if size[key] > MAX_YAML_NODES:
            return (f"expands to more than {MAX_YAML_NODES:,} values once its aliases are expanded "
                    "(an alias bomb?)")
    return None


#: Depth step of each flow-collection bracket.
_FLOW_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_FLOW_BRACKET = re.compile(r"[\[\]{}]")


def flow_depth(text: str) -> int:
    """Deepest nesting of YAML flow collections (``[``, ``{``) in ``text``, counted on its brackets alone.

    Linear in the text, where PyYAML's scanner takes time quadratic in the depth of an open flow
    collection before its composer's recursion gives up (a 2,000-deep ``model: [[[...]]]`` took 1.5 CPU s
    there, and 30 s of wall time on a loaded machine, against a few ms here). Brackets inside quoted or
    plain strings count too, so the depth is over-counted only for a string holding more than
    ``MAX_YAML_DEPTH`` unclosed brackets; unmatched closing ones only lower it, and PyYAML's own limit
    still applies then."""
    return max(accumulate((_FLOW_STEP[c] for c in _FLOW_BRACKET.findall(text)), initial=0))


def load_yaml(text: str, where: str, file: str = "") -> Any:
    """Parse one YAML document (``None`` for an empty one) within the size, depth and alias limits.

    Raises:
        ConfigError: malformed YAML, or a document past the limits; the problem's path is ``where``,
        its message starts with ``file`` when given.
    """
    what = f"{file!r}: " if file else ""
    if flow_depth(text) > MAX_YAML_DEPTH:
        raise ConfigError(Problem(where, f"{what}nested deeper than {MAX_YAML_DEPTH} levels"))
    try:
        # the reader checks every character at construction: a NUL byte raises here, not on parsing
        loader = yaml.SafeLoader(text)
    except yaml.YAMLError as exc:
        raise ConfigError(Problem(where, f"{what}malformed YAML: {exc}")) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        why = _expanded_problem(node)
        if why:
            raise ConfigError(Problem(where, f"{what}{why}"))
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise ConfigError(Problem(where, f"{what}malformed YAML: {exc}")) from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(Problem(where, f"{what}nested deeper than {MAX_YAML_DEPTH} levels")) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts (sys.int_info)
        raise ConfigError(Problem(where, f"{what}malformed YAML: {exc}")) from None
    finally:
        loader.dispose()


def load_json(text: str, where: str, file: str = "") -> Any:
    """Parse a JSON document; ConfigError naming ``where`` (and ``file``) when malformed or nested too deeply."""
    what = f"{file!r}: " if file else ""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(Problem(where, f"{what}malformed JSON: {exc}")) from None
    except RecursionError:
        raise ConfigError(Problem(where, f"{what}nested deeper than {MAX_YAML_DEPTH} levels")) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ConfigError(Problem(where, f"{what}malformed JSON: {exc}")) from None
    return data


def read_text(path: str | Path, where: str) -> str:
    """The text of a UTF-8 file of at most ``MAX_CONFIG_BYTES``; ConfigError naming ``where`` and the file
    when it is missing, a directory, too big, unreadable or not UTF-8."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(Problem(where, f"{str(p)!r} is a directory, not a file"))
    if not p.is_file():
        raise ConfigError(Problem(where, f"file not found: {str(p)!r}"))
    try:
        size = p.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(Problem(where, f"{str(p)!r} is {size:,} bytes; a config file may have at most "
                                             f"{MAX_CONFIG_BYTES:,}"))
        with p.open("rb") as fh:  # read at most the cap, should the file grow meanwhile
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(Problem(where, f"cannot read {str(p)!r}: {exc.strerror or exc}")) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(Problem(where, f"{str(p)!r} has more than {MAX_CONFIG_BYTES:,} bytes"))
    try:
        return raw.decode("utf-8-sig")  # -sig: an editor's byte-order mark
    except UnicodeDecodeError as exc:
        raise ConfigError(Problem(where, f"{str(p)!r} is not UTF-8 text (byte {exc.start}: "
                                         f"{raw[exc.start:exc.start + 1]!r}); save it as UTF-8")) from None


def read_document(path: str | Path, where: str) -> Any:
    """Read a YAML file (JSON when its suffix is ``.json``) within the limits above."""
    text = read_text(path, where)
    if Path(path).suffix.lower() == ".json":
        return load_json(text, where, str(path))
    return load_yaml(text, where, str(path))
