"""Read a YAML config, apply ``--set a.b=c`` overrides in order, and validate it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from miniverl.config.schema import MiniverlConfig
from miniverl.errors import ConfigError


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (IsADirectoryError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc.__class__.__name__}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"malformed YAML in {path}{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a YAML mapping at the top level")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value``: the value is parsed as a YAML scalar/flow value (``2``, ``true``, ``[1, 2]``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {text!r} is not of the form section.key=value")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        raise ConfigError(f"--set {text!r}: the value is not a valid YAML scalar") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node: dict[str, Any] = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


def validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    kind = first["type"]
    if kind == "extra_forbidden":
        return f"unknown key {where!r}"
    message = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {message}{more}"


def validate_config(data: dict[str, Any], *, origin: str) -> MiniverlConfig:
    try:
        return MiniverlConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config {origin}: {validation_message(exc)}") from None


def load_config(path: Path, overrides: list[str] | None = None) -> MiniverlConfig:
    data = apply_overrides(read_yaml(path), list(overrides or []))
    return validate_config(data, origin=str(path))
