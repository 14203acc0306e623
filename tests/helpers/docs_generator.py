"""``scripts/docs/generate.py`` loaded as a module (it is a script, not a package member), for tests that check the
generated pages or share its formatting of committed measurements."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "docs" / "generate.py"


def load_generator() -> ModuleType:
    if "docs_generate" in sys.modules:
        return sys.modules["docs_generate"]
    spec = importlib.util.spec_from_file_location("docs_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
