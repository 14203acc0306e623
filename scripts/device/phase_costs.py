"""What a `miniverl` CLI invocation pays before its work, on this machine: each phase in a fresh process, 3 times.

Phases, each one process that does everything before it too (the median of 3, and every sample):
  start           `python -c pass`
  cli_import      `import miniverl.cli` (what a torch-free command such as `inspect` or `plan` pays)
  torch_stack     + torch, transformers, peft (what a training or export command imports)
  cuda_init       + the CUDA context and one allocation
  model_load      + SmolLM2 from the verified safetensors cache ($MINIVERL_CACHE/models/...) onto the GPU in bf16

Prints one JSON object on stdout. The model cache is the qualification's own: it waits (up to 240 s) for the smoke's
`models fetch` to have built it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PHASES = {
    "start": "pass",
    "cli_import": "import miniverl.cli",
    "torch_stack": "import miniverl.cli, torch, transformers, peft",
    "cuda_init": (
        "import miniverl.cli, torch, transformers, peft; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
    ),
    "model_load": (
        "import sys, miniverl.cli, torch, transformers, peft; torch.zeros(1, device='cuda');"
        "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).to('cuda');"
        "torch.cuda.synchronize()"
    ),
}


def _model_dir(timeout: float = 240.0) -> Path | None:
    root = Path(os.environ.get("MINIVERL_CACHE", "~/.cache/miniverl")).expanduser() / "models"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(p.parent for p in root.glob("*/*/model.safetensors"))
        if found:
            return found[0]
        time.sleep(2)
    return None


def main() -> None:
    model = _model_dir()
    samples: dict[str, list[float]] = {}
    for phase, code in PHASES.items():
        if phase == "model_load" and model is None:
            continue
        argv = [sys.executable, "-c", code, *([str(model)] if phase == "model_load" else [])]
        runs = []
        for _ in range(3):
            began = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True)
            runs.append(round(time.perf_counter() - began, 3))
        samples[phase] = runs
    print(
        json.dumps(
            {
                "python": sys.version.split()[0],
                "model": model.parent.name if model else None,
                "median_seconds": {k: statistics.median(v) for k, v in samples.items()},
                "samples_seconds": samples,
            },
            indent=1,
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
