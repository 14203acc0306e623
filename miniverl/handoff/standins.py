"""Named stand-ins for the vLLM imports that verl 0.9.1's ``validate_config`` needs.

With ``rollout.name: vllm`` and a LoRA rank, ``verl.utils.config.validate_config`` runs
``from verl.workers.rollout.vllm_rollout.utils import get_vllm_max_lora_rank``. Importing that
module imports vLLM itself (the package ``__init__`` imports the vLLM server adapter and checks
the installed vllm distribution; ``utils`` imports ``vllm.outputs`` and ``verl.utils.vllm``).
vLLM cannot be installed on a CPU machine, so when it is absent we stand in for exactly two
modules:

- ``verl.workers.rollout.vllm_rollout`` (an empty package), and
- ``verl.workers.rollout.vllm_rollout.utils``, holding verl's own ``get_vllm_max_lora_rank``:
  its source is read from the installed verl file and only that function is compiled, so the
  check that runs is verl's code (its ``vllm.config.lora`` import fails and it uses verl's
  built-in list of vLLM's allowed LoRA ranks, as verl itself does when that import fails).

Nothing else is replaced. With vLLM installed, no stand-in is used.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path
from typing import Literal, get_args

PACKAGE = "verl.workers.rollout.vllm_rollout"
UTILS = f"{PACKAGE}.utils"
FUNCTION = "get_vllm_max_lora_rank"


def install_vllm_standins() -> list[str]:
    """Install the stand-ins when vLLM is not importable; returns the stand-in module names."""
    if importlib.util.find_spec("vllm") is not None:
        return []
    if UTILS in sys.modules and getattr(sys.modules[UTILS], "__miniverl_stand_in__", False):
        return [PACKAGE, UTILS]
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise ImportError("verl is not installed")
    source_path = Path(spec.origin).parent / "workers" / "rollout" / "vllm_rollout" / "utils.py"
    tree = ast.parse(source_path.read_text(encoding="utf-8"), filename=str(source_path))
    functions: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == FUNCTION]
    if len(functions) != 1:
        raise ImportError(f"verl's {UTILS} has no {FUNCTION}; this verl is not the version the stand-in knows")
    namespace: dict[str, object] = {"Literal": Literal, "get_args": get_args, "__name__": UTILS}
    code = compile(ast.Module(body=functions, type_ignores=[]), str(source_path), "exec")
    exec(code, namespace)  # verl's own function body, nothing else from that module
    package = types.ModuleType(PACKAGE, "miniverl stand-in: vLLM is not installed")
    package.__path__ = []
    utils = types.ModuleType(UTILS, f"miniverl stand-in: only verl's {FUNCTION}")
    setattr(utils, FUNCTION, namespace[FUNCTION])
    for module in (package, utils):
        module.__miniverl_stand_in__ = True  # type: ignore[attr-defined]
    sys.modules[PACKAGE] = package
    sys.modules[UTILS] = utils
    return [PACKAGE, UTILS]
