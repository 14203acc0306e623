"""A fresh process with only transformers and peft loads the exported adapter by the hub id it names (a local
HF cache stands in for the hub, offline), and gives the logits of the dequantized base + the same adapter.

    HF_HUB_CACHE=fake-hub HF_HUB_OFFLINE=1 python autopeft_load.py adapter/ DEQUANTIZED_BASE_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from peft import AutoPeftModelForCausalLM, PeftModel
from transformers import AutoModelForCausalLM


def main(adapter: str, local_base: str) -> None:
    config = json.loads((Path(adapter) / "adapter_config.json").read_text())
    print("base_model_name_or_path:", config["base_model_name_or_path"], "revision:", config.get("revision"))
    start = time.perf_counter()
    auto = AutoPeftModelForCausalLM.from_pretrained(adapter, dtype=torch.float32)
    seconds = time.perf_counter() - start
    print(f"AutoPeftModelForCausalLM.from_pretrained: {seconds:.1f}s, dtype {next(auto.parameters()).dtype}")
    base = AutoModelForCausalLM.from_pretrained(local_base, dtype=torch.float32)
    reference = PeftModel.from_pretrained(base, adapter)
    ids = torch.tensor([[1, 504, 3458, 314, 216, 34, 1232, 216, 34, 47, 2]])
    with torch.no_grad():
        diff = (auto(input_ids=ids).logits - reference(input_ids=ids).logits).abs().max()
    print("max |logit diff| against the dequantized base + adapter:", float(diff))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
