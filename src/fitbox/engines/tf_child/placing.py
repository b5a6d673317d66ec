"""How the model is placed as it loads: the device map and, for the 4bit rung, bitsandbytes.

``--device auto`` lets accelerate spread the layers over the GPUs (a split); with
``--experts-in-ram`` every module under ``.experts`` (the routed experts of a mixture of
experts, as fitbox priced them from the header: models/transformers_layout.py) is kept in
host RAM and the rest goes to the first GPU. ``--load-in-4bit`` quantizes every linear
layer but the head to 4-bit as it loads (BitsAndBytesConfig defaults: NF4 blocks of 64),
computing in the checkpoint's own dtype; a 4-bit model cannot be moved after loading, so
it is always loaded straight onto its device.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

EXPERT = re.compile(r"(?:^|\.)experts(?:\.|$)")


def _experts_in_ram(folder: Path) -> dict[str, Any]:
    """Every module holding weights, mapped to cpu (an expert's) or GPU 0 (the rest)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights():
        empty = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    found: dict[str, Any] = {}
    for name, module in empty.named_modules():
        if any(True for _ in module.parameters(recurse=False)) or any(
            True for _ in module.buffers(recurse=False)
        ):
            found[name] = "cpu" if EXPERT.search(name) else 0
    return found


def load_options(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """``from_pretrained`` keywords for this placement; empty: load, then ``.to(device)``."""
    import torch

    options: dict[str, Any] = {}
    if args.experts_in_ram and torch.cuda.is_available():
        options["device_map"] = _experts_in_ram(Path(args.model))
    elif args.device == "auto":
        options["device_map"] = "auto"
    if args.load_in_4bit:
        from transformers import AutoConfig, BitsAndBytesConfig

        config = AutoConfig.from_pretrained(args.model)
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        compute = dtype if isinstance(dtype, torch.dtype) else torch.float32
        options["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_compute_dtype=compute
        )
        options.setdefault("device_map", {"": 0 if device == "cuda" else "cpu"})
    return options
