"""Strict readers for every JSON and YAML file miniverl reads.

- JSON: duplicate keys, ``NaN``/``Infinity`` and integers longer than :data:`MAX_INT_DIGITS`
  digits are refused (the stdlib accepts the first two silently and raises a bare ``ValueError``
  past 4300 digits).
- YAML: safe loading with duplicate mapping keys refused (PyYAML keeps the last one silently), so
  a config with two ``train:`` sections is an error, not a silent override.

Errors are :class:`StrictFormatError` (a ``ValueError``) with a one-line message; callers turn
them into the :class:`~miniverl.errors.UsageError` subclass that fits the file.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

MAX_INT_DIGITS = 64
#: Containers nested deeper than this in a JSON or YAML input are refused (real configs nest < 10 deep).
MAX_DEPTH = 64
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep (the limit for any input)"
#: A YAML document may not expand (aliases counted every time they are used) to more nodes than this.
MAX_YAML_NODES = 200_000
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class StrictFormatError(ValueError):
    """A JSON or YAML document that parses but is refused (duplicate key, non-finite, huge int)."""


def nesting_depth(value: Any) -> int:
    """How deeply dicts and lists nest in ``value`` (a scalar: 0), computed without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            return depth
        stack.extend((child, depth) for child in children)
    return deepest


def refuse_surrogates(value: Any, *, origin: str = "") -> None:
    """A :class:`StrictFormatError` when a string (a key or a value) in ``value`` holds a lone UTF-16 surrogate
    (``\\ud800``...): such a string cannot be written as UTF-8, so it would fail later, far from its source."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                where = f" in {origin}" if origin else ""
                raise StrictFormatError(
                    f"a lone surrogate \\u{ord(found.group()):04x}{where} is not a character; "
                    "write the text as UTF-8 (a pair \\ud83d\\ude00 is fine, half of one is not)"
                )
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise StrictFormatError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise StrictFormatError(f"non-finite number {name} (JSON records hold finite numbers only)")


def _integer(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise StrictFormatError(f"integer with {digits} digits (more than {MAX_INT_DIGITS})")
    return int(text)


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses duplicate keys, NaN/Infinity and huge integers.

    Raises :class:`StrictFormatError` for those and for malformed JSON (message: what and where).
    """
    try:
        value = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant, parse_int=_integer)
    except json.JSONDecodeError as exc:
        raise StrictFormatError(f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise StrictFormatError(_TOO_DEEP) from None
    if nesting_depth(value) > MAX_DEPTH:
        raise StrictFormatError(_TOO_DEEP)
    if _SURROGATE_ESCAPE.search(text):  # only an escape can put a lone surrogate in text decoded as UTF-8
        refuse_surrogates(value)
    return value


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping key seen twice in the same mapping."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *anchor` merges may be overridden by explicit keys
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable keys: SafeLoader reports them itself
        if duplicate:
            mark = key_node.start_mark
            raise StrictFormatError(
                f"duplicate key {key!r} at line {mark.line + 1}, column {mark.column + 1} "
                "(each key and each section may appear once)"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    digits = sum(ch.isdigit() for ch in str(node.value))
    if digits > MAX_INT_DIGITS:
        mark = node.start_mark
        raise StrictFormatError(f"integer with {digits} digits at line {mark.line + 1} (more than {MAX_INT_DIGITS})")
    value: int = yaml.SafeLoader.construct_yaml_int(loader, node)
    return value


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _expanded_nodes(root: yaml.Node) -> int:
    """How many nodes the document has once every alias is expanded, counted over the composed graph (each
    node's size is computed once, so a billion-laughs document costs its own size, not its expansion); a
    :class:`StrictFormatError` past :data:`MAX_YAML_NODES` or for an alias of one of its own ancestors."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            sizes[key] = 1
            continue
        if children_done:
            open_nodes.discard(key)
            total = 1 + sum(sizes[id(child)] for child in children)
            if total > MAX_YAML_NODES:
                raise StrictFormatError(
                    f"the document expands to more than {MAX_YAML_NODES:,} nodes (aliases counted each time they "
                    "are used); write the values out or make the document smaller"
                )
            sizes[key] = total
            continue
        if key in open_nodes:
            raise StrictFormatError("an alias refers to a node that contains it (a recursive anchor)")
        open_nodes.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise StrictFormatError("an alias refers to a node that contains it (a recursive anchor)")
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def loads_yaml(text: str) -> Any:
    """Safe-load one YAML document; duplicate keys, deep nesting, an alias expansion past :data:`MAX_YAML_NODES`
    and lone surrogates raise :class:`StrictFormatError`."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()  # composed, not constructed: aliases are still shared nodes
        if node is None:
            return None
        _expanded_nodes(node)
        value = loader.construct_document(node)
    except RecursionError:  # PyYAML composes nodes recursively
        raise StrictFormatError(_TOO_DEEP) from None
    finally:
        loader.dispose()
    if nesting_depth(value) > MAX_DEPTH:
        raise StrictFormatError(_TOO_DEEP)
    refuse_surrogates(value)
    return value
