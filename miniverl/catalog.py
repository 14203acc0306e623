"""What ``miniverl rewards list`` and ``miniverl models list`` show. Torch-free."""

from __future__ import annotations

import inspect
import re
from typing import Any

from miniverl.rewards.base import META_KEYS, get_reward, list_rewards


def plain_text(docstring: str) -> str:
    """A docstring line for a terminal: RST roles and double backticks (``x``, :func:`f`) become plain words."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", docstring)
    return re.sub(r"``([^`]+)``", r"\1", text)


def rewards_catalog() -> list[dict[str, Any]]:
    """Each registered reward: name, one-line summary, and the ``params`` a config may set."""
    out = []
    for name in list_rewards():
        fn = get_reward(name)
        params = []
        for parameter in list(inspect.signature(fn).parameters.values())[2:]:
            if parameter.kind is not inspect.Parameter.KEYWORD_ONLY and parameter.kind is not (
                inspect.Parameter.POSITIONAL_OR_KEYWORD
            ):
                continue
            if parameter.name in META_KEYS:
                continue
            default = None if parameter.default is inspect.Parameter.empty else parameter.default
            params.append({"name": parameter.name, "default": default})
        doc = inspect.getdoc(fn) or ""
        needs = sorted(
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.name in META_KEYS and p.default is inspect.Parameter.empty
        )
        summary = plain_text(doc.split("\n\n")[0].replace("\n", " "))
        out.append({"name": name, "summary": summary, "params": params, "uses": needs})
    return out


def render_rewards(catalog: list[dict[str, Any]]) -> str:
    lines = []
    for item in catalog:
        lines.append(f"{item['name']}: {item['summary']}")
        params = ", ".join(f"{p['name']}={p['default']!r}" for p in item["params"]) or "none"
        lines.append(f"    params: {params}")
        if item["uses"]:
            lines.append(f"    per-sample inputs: {', '.join(item['uses'])}")
    lines.append("Plug in your own as 'package.module:function' (fn(prompt, response, **meta) -> float).")
    return "\n".join(lines)


def models_catalog() -> list[dict[str, Any]]:
    """The builtin models with their pins and whether a verified copy is cached here."""
    from miniverl.models.builtin import BUILTIN_PINS, cached_builtin

    out = []
    for name, pin in sorted(BUILTIN_PINS.items()):
        cached = cached_builtin(name)
        out.append(
            {
                "name": name,
                "source": "builtin",
                "from": f"{pin.package}=={pin.version} ({pin.gguf_member})",
                "gguf_sha256": pin.gguf_sha256,
                "cached": cached is not None,
                "path": str(cached) if cached is not None else None,
                "config": {"source": "builtin", "model_id": name},
            }
        )
    return out


def render_models(catalog: list[dict[str, Any]]) -> str:
    lines = ["builtin models (use as `models.student: {source: builtin, model_id: NAME}`):"]
    for item in catalog:
        state = f"cached at {item['path']}" if item["cached"] else f"not cached: miniverl models fetch {item['name']}"
        lines.append(f"  {item['name']}  from {item['from']}  [{state}]")
    lines.append(
        "other sources: hub (model_id + 40-hex revision), local (a model directory), gguf (a .gguf file); "
        "teachers and references may use source: student"
    )
    return "\n".join(lines)
