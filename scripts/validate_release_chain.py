#!/usr/bin/env python3
"""Torch-free auditor of a miniverl release chain (candidate, qualification, optional release assets).

    python scripts/validate_release_chain.py --candidate-dir D --candidate-manifest D/candidate-manifest.json \
        --qualification Q/qualification.json --commit <sha> --known-good-sha256 <sha> \
        --required-gpu-name "NVIDIA GeForce RTX 4080" [--assets-dir A [--gate-record gate.json]] \
        [--level full_qualification]

Needs only pydantic (harness/requirements-audit.txt); never imports torch or miniverl.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.audit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
