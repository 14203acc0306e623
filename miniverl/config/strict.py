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
from typing import Any

import yaml

MAX_INT_DIGITS = 64
#: Containers nested deeper than this in a JSON or YAML input are refused (real configs nest < 10 deep).
MAX_DEPTH = 64
_TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep (the limit for any input)"


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


def loads_yaml(text: str) -> Any:
    """Safe-load one YAML document; duplicate keys and deep nesting raise :class:`StrictFormatError`."""
    try:
        value = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except RecursionError:  # PyYAML composes nodes recursively
        raise StrictFormatError(_TOO_DEEP) from None
    if nesting_depth(value) > MAX_DEPTH:
        raise StrictFormatError(_TOO_DEEP)
    return value
