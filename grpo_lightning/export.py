"""The trained policy as a Hugging Face folder: what ``from_pretrained`` and vLLM load.

:func:`export_hf` writes safetensors weights, ``config.json``, the tokenizer and the
generation config into a temporary folder next to the target and renames it into place,
so a reader never sees half a folder. One function per kind of folder: a LoRA run can add
an adapter folder and a merged folder beside this one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from torch import nn
from transformers import PreTrainedTokenizerBase


def export_hf(policy: nn.Module, tokenizer: PreTrainedTokenizerBase, folder: str | Path) -> Path:
    """Write ``policy`` and ``tokenizer`` to ``folder`` (replaced if it exists); returns the folder."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    policy.save_pretrained(staging, safe_serialization=True)  # config, weights, generation config
    tokenizer.save_pretrained(staging)
    generation = getattr(policy, "generation_config", None)
    if generation is not None and not (staging / "generation_config.json").exists():
        generation.save_pretrained(staging)
    if folder.exists():
        old = folder.parent / f".{folder.name}.old{os.getpid()}"
        folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(folder)
    return folder
