"""Fake dist-info stubs of the GPU image's known packages, so pip's resolver treats them as installed."""

import json
import pathlib
import re
import sys

KNOWN_GOOD = pathlib.Path("/work/wt-32v/known-good/h100-cu130.json")
# The device notes' `pip list` of the image (KINDS.md, nvidia-h200 row), the names it was asked for.
DEVICE_NOTES_PIP_LIST = (
    "accelerate 1.15.0, botorch 0.18.1, cupy-cuda13x 14.2.0, gpytorch 1.15.2, huggingface_hub 1.33.0, "
    "jax 0.11.2, jax-cuda13-pjrt 0.11.2, jax-cuda13-plugin 0.11.2, jaxlib 0.11.2, jaxtyping 0.3.11, "
    "numpy 2.5.2, numpyro 0.21.0, onnx 1.23.1, onnx-ir 1.0.0, onnxruntime 1.30.0, onnxscript 0.7.2, "
    "pytorch-lightning 2.6.6, safetensors 0.8.0, sentence-transformers 6.0.1, sentencepiece 0.2.2, "
    "tiktoken 0.14.0, tokenizers 0.23.2, torch 2.11.0, torch-geometric 2.8.0.post1, torchaudio 2.11.0, "
    "torchdiffeq 0.2.5, torchmetrics 1.9.0, torchvision 0.26.0, transformers 5.17.0, triton 3.6.0"
)


def main(site: pathlib.Path) -> None:
    packages: dict[str, str] = dict(json.loads(KNOWN_GOOD.read_text())["packages"])
    for item in DEVICE_NOTES_PIP_LIST.split(", "):
        name, version = item.split(" ")
        packages[re.sub(r"[-_.]+", "-", name).lower()] = version
    for name, version in sorted(packages.items()):
        dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir(exist_ok=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (dist_info / "INSTALLER").write_text("stub\n")
        (dist_info / "RECORD").write_text("")
    pathlib.Path("image-known.json").write_text(json.dumps(packages, indent=1, sort_keys=True))
    print(len(packages), "stubs")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
