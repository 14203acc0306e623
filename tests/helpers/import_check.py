"""``scripts/check_import_cycles.py`` loaded as a module (it is a script, not a package module)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_import_cycles.py"


def load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_import_cycles", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
