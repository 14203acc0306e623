"""The part of vLLM 0.26.0's wheel that an in-process ``vllm.LLM`` on Hopper loads, for a device call's carry.

Left out (docs/measurements/2026-12-06-vllm-closure/README.md): FlashAttention 2's extension (Hopper runs FA3,
``VLLM_FLASH_ATTN_VERSION=3``; its import is guarded) and the Rust server front end ``vllm-rs`` (``LLM`` in-process
never starts it). Nothing is rebuilt: every kept file is the wheel's own bytes, checked on the device against the
wheel's ``RECORD`` and the staged manifest, as ``ray_subset.py`` does for ray.

    python vllm_subset.py pins CLOSURE.json OUT.txt           # here: the kept wheels as `name==version --hash`
    python vllm_subset.py make VLLM.whl OUT.tar.xz OUT.json   # here
    python vllm_subset.py check SITE MANIFEST.json            # device
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ray_subset import check, make  # a sibling script, not a package

LEFT_OUT = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/vllm-rs",
)


def pins(closure: Path, out: Path) -> None:
    """The closure's wheels that travel (``leave_out`` null, vllm itself included), each pinned by its sha256."""
    doc = json.loads(closure.read_text())
    kept = [w for w in doc["wheels"] if w["leave_out"] is None]
    out.write_text("".join(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in kept))
    print(f"{len(kept)} wheels of {len(doc['wheels'])} travel, {sum(w['bytes'] for w in kept)} bytes")


if __name__ == "__main__":
    if sys.argv[1:2] == ["pins"] and len(sys.argv) == 4:
        pins(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["make"] and len(sys.argv) == 5:
        make(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), LEFT_OUT)
    elif sys.argv[1:2] == ["check"] and len(sys.argv) == 4:
        check(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(
            "usage: vllm_subset.py pins CLOSURE.json OUT.txt | make VLLM.whl OUT.tar.xz OUT.json "
            "| check SITE MANIFEST.json"
        )
