"""``miniverl doctor``: versions, devices and a verdict per capability. Works without torch."""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

from miniverl import __version__

PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "safetensors", "pyarrow", "gguf")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _verdict(ok: bool, reason: str) -> dict[str, str]:
    return {"verdict": "ok" if ok else "unavailable", "reason": reason}


def collect() -> dict[str, Any]:
    versions: dict[str, str | None] = {"python": platform.python_version(), "miniverl": __version__}
    versions.update({name: _version(name) for name in PACKAGES})
    report: dict[str, Any] = {
        "versions": versions,
        "platform": {"system": platform.system(), "machine": platform.machine()},
        "devices": [{"type": "cpu", "name": platform.processor() or platform.machine()}],
        "gpu_name": None,
        "cuda_runtime": None,
    }
    train_stack = [name for name in ("torch", "transformers", "peft", "safetensors") if versions[name] is None]
    cuda_ok = False
    if versions["torch"] is not None:
        import torch

        report["cuda_runtime"] = versions["cuda"] = torch.version.cuda
        cuda_ok = bool(torch.cuda.is_available())
        if cuda_ok:
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                report["devices"].append(
                    {"type": "cuda", "index": index, "name": props.name, "total_memory_bytes": props.total_memory}
                )
            report["gpu_name"] = torch.cuda.get_device_name(0)
            report["driver"] = _nvidia_driver()
    missing = ", ".join(train_stack)
    cpu = _verdict(not train_stack, "train stack present" if not train_stack else f"missing: {missing}")
    if train_stack:
        gpu = _verdict(False, f"missing: {missing}")
    else:
        gpu = _verdict(cuda_ok, "CUDA device available" if cuda_ok else "no CUDA device visible to torch")
    has_bnb = versions["bitsandbytes"] is not None
    if train_stack or not has_bnb:
        nf4 = _verdict(False, "needs the train and cuda extras (bitsandbytes)")
    else:
        where = "CUDA" if cuda_ok else "CPU (avx512-bf16 repack disabled by miniverl)"
        nf4 = _verdict(True, f"bitsandbytes on {where}")
    report["capabilities"] = {"cpu_training": cpu, "gpu_training": gpu, "nf4": nf4}
    return report


def _nvidia_driver() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def render(report: dict[str, Any]) -> str:
    lines = ["miniverl doctor", ""]
    lines += [f"  {name:<13} {value or 'not installed'}" for name, value in report["versions"].items()]
    lines.append(f"  {'cuda runtime':<13} {report['cuda_runtime'] or 'none'}")
    lines.append(f"  {'gpu':<13} {report['gpu_name'] or 'none'}")
    lines.append("")
    for name, cap in report["capabilities"].items():
        lines.append(f"  {name:<13} {cap['verdict']:<12} {cap['reason']}")
    return "\n".join(lines)
