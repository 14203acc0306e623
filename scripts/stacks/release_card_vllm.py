"""Declare vLLM's closure in the release card's known-good stack (known-good/rtx4080-wsl2-cu130.txt).

The release card runs ``rollout.backend: vllm`` (its policy requires ``vllm_boundary``), so its venv installs
``miniverl[train,cuda,vllm]`` and every package of that closure must be pinned. What is pinned here, each from a
measurement of this repository:

* the 135 wheels pip resolved for ``vllm==0.26.0`` on Python 3.12 / torch 2.11 (``closure.json`` of
  docs/measurements/2026-12-06-vllm-closure/): where vLLM's closure moved a package the card already pinned
  (numpy 2.3.5 for numba, cuda-bindings 13.4.4, setuptools 80.10.2 for ``<81``), vLLM's version wins;
* the GPU image's packages that closure required but pip found installed there (the resolver saw them as stubs
  made by ``make_stubs.py`` beside it), at the image's versions, with the packages those require in turn
  (their metadata is not in the report: :data:`IMAGE_PACKAGES` names them);
* torchaudio and torchvision with the ``+cu130`` label, from the same extra index as torch.

The card's stack stays ``declared`` (re-record it on the runner with ``python -m harness stack record``).
Usage: ``python scripts/stacks/release_card_vllm.py`` rewrites the .txt; then ``python -m harness stack describe``
as the .txt's header says. Run with ``--check`` it writes nothing and exits 1 where the file differs.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARD = ROOT / "known-good" / "rtx4080-wsl2-cu130.txt"
CLOSURE = ROOT / "docs" / "measurements" / "2026-12-06-vllm-closure" / "closure.json"
#: the image's versions of the packages vLLM's closure required from it (the resolver's stubs, from the H100
#: image's pip list and known-good/h100-cu130) and the packages those require in turn
IMAGE_PACKAGES = {
    "h11": "0.16.0",
    "httpcore": "1.0.9",
    "httpx": "0.28.1",
    "jinja2": "3.1.6",
    "markupsafe": "3.0.3",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "torchaudio": "2.11.0+cu130",
    "torchvision": "0.26.0+cu130",
    "typer": "0.27.2",
    "shellingham": "1.5.4",
    "rich": "15.0.0",
    "markdown-it-py": "4.2.0",
    "mdurl": "0.1.2",
    "pygments": "2.21.0",
}
VLLM_HEADER = (
    "# vLLM 0.26.0 and its closure (rollout.backend: vllm; the card requires vllm_boundary) are pinned by\n"
    "# scripts/stacks/release_card_vllm.py from docs/measurements/2026-12-06-vllm-closure/closure.json\n"
)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def render(text: str, closure: dict[str, str]) -> str:
    ours = tuple(line[:24] for line in VLLM_HEADER.splitlines())  # this script's header, as any earlier run wrote it
    header = [line for line in text.splitlines() if line.startswith(("#", "--")) and not line.startswith(ours)]
    pins: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "--")):
            name, version = line.split("==", 1)
            pins[norm(name)] = version
    pins.update(IMAGE_PACKAGES)
    pins.update(closure)  # vLLM's own resolution wins where it moved a package
    comments = [h for h in header if h.startswith("#")]
    options = [h for h in header if h.startswith("--")]
    body = [f"{name}=={pins[name]}" for name in sorted(pins)]
    return "\n".join([*comments, *VLLM_HEADER.splitlines(), *options, *body]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where the file differs")
    args = parser.parse_args(argv)
    wheels = json.loads(CLOSURE.read_text())["wheels"]
    closure = {norm(w["name"]): w["version"] for w in wheels}
    current = CARD.read_text()
    wanted = render(current, closure)
    if args.check:
        if wanted != current:
            print(
                f"{CARD.relative_to(ROOT)} does not declare vLLM's closure: run {Path(__file__).name}", file=sys.stderr
            )
            return 1
        return 0
    CARD.write_text(wanted)
    print(f"wrote {CARD.relative_to(ROOT)}: {len(wanted.splitlines())} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
