"""Read a YAML config, apply ``--set a.b=c`` overrides in order, and validate it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from miniverl import bounded
from miniverl.config.schema import MiniverlConfig
from miniverl.config.strict import StrictFormatError, loads_yaml
from miniverl.config.suggest import suggestion
from miniverl.errors import ConfigError


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = bounded.read_text(path, limit=bounded.CONFIG_MAX_BYTES, what="a config")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config {path} is a directory; give a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc.__class__.__name__}") from None
    try:
        data = loads_yaml(text)
    except StrictFormatError as exc:
        raise ConfigError(f"config {path}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"malformed YAML in {path}{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a YAML mapping at the top level")
    return data


def _shown(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value``: the value is parsed as a YAML scalar/flow value (``2``, ``true``, ``[1, 2]``)."""
    key, sep, raw = text.partition("=")
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {_shown(text)} is not of the form section.key=value")
    try:
        value = loads_yaml(raw) if raw != "" else ""
    except StrictFormatError as exc:
        raise ConfigError(f"--set {_shown(text)}: {exc}") from None
    except yaml.YAMLError:
        raise ConfigError(f"--set {_shown(text)}: the value is not a valid YAML scalar") from None
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
                raise ConfigError(f"--set {_shown(text)}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


def validation_message(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first error as one line; an unknown key of ``model`` (a config) comes with a "did you mean"."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "config"
    kind = first["type"]
    if kind == "extra_forbidden":
        hint = suggestion(model, first["loc"]) if model is not None else None
        return f"unknown key {where!r}" + (f"; did you mean {hint}?" if hint else "")
    message = str(first["msg"]).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {message}{more}"


def validate_config(data: dict[str, Any], *, origin: str) -> MiniverlConfig:
    """Validate ``data``; also refuse what pydantic's lax mode lets through.

    - a YAML bool where the schema wants a number (``--set train.cycles=true`` would become 1);
    - a non-finite number anywhere (``--set train.learning_rate=.inf``).
    """
    try:
        config = MiniverlConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config {origin}: {validation_message(exc, MiniverlConfig)}") from None
    problem = _bool_as_number(data, config, "") or _non_finite(config.model_dump(mode="python"), "")
    if problem:
        raise ConfigError(f"invalid config {origin}: {problem}")
    return config


def _bool_as_number(raw: Any, value: Any, where: str) -> str | None:
    """The first place where ``raw`` holds true/false but the validated ``value`` is a number."""
    if isinstance(raw, bool):
        if not isinstance(value, bool) and isinstance(value, int | float):
            return f"{where}: expected a number, got {str(raw).lower()}"
        return None
    if isinstance(raw, dict):
        for key, item in raw.items():
            if isinstance(value, BaseModel):
                child = getattr(value, str(key), None)
            elif isinstance(value, dict):
                child = value.get(key)
            else:
                return None
            found = _bool_as_number(item, child, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(raw, list | tuple) and isinstance(value, list | tuple):
        for index, (item, child) in enumerate(zip(raw, value, strict=False)):
            found = _bool_as_number(item, child, f"{where}.{index}")
            if found:
                return found
    return None


#: Integers in a config must fit in 64 bits (counts, seeds, sizes); larger ones are typos.
INT_LIMIT = 2**63 - 1


def _non_finite(value: Any, where: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value} is not a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
        return f"{where}: {value:.3e} is out of range (at most 2**63 - 1)"
    items: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = [(str(i), v) for i, v in enumerate(value)]
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if where else key)
        if found:
            return found
    return None


def load_config(path: Path, overrides: list[str] | None = None) -> MiniverlConfig:
    data = apply_overrides(read_yaml(path), list(overrides or []))
    return validate_config(data, origin=str(path))
