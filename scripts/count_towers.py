"""Count the parameters of real multimodal checkpoints by building their transformers model on
PyTorch's meta device (no weights, no download) from the config.json in
tests/data/checkpoints/multimodal/, split into the text model and the rest (vision/audio towers and
projector). Prints JSON; tests/data/checkpoints/multimodal/params.json is its output.

    .venv/bin/python scripts/count_towers.py > tests/data/checkpoints/multimodal/params.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForImageTextToText

ROOT = Path(__file__).resolve().parents[1] / "tests" / "data" / "checkpoints" / "multimodal"
TEXT_PREFIXES = ("model.language_model.", "language_model.", "lm_head.", "model.lm_head.")


def count(folder: Path) -> dict:
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    text = rest = 0
    for name, param in model.named_parameters(remove_duplicate=True):
        if name.startswith(TEXT_PREFIXES):
            text += param.numel()
        else:
            rest += param.numel()
    return {"model": folder.name, "architecture": type(model).__name__, "text_params": text, "tower_params": rest}


if __name__ == "__main__":
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "rows": [count(f) for f in sorted(ROOT.iterdir()) if (f / "config.json").is_file()]}
    json.dump(out, sys.stdout, indent=1)
    print()
