"""The trained policy as a Hugging Face folder: what ``from_pretrained`` and vLLM load.

:func:`export_hf` writes safetensors weights, ``config.json``, the tokenizer and the
generation config into a temporary folder next to the target and renames it into place,
so a reader never sees half a folder. A LoRA policy's folder holds the merged weights (plain
transformers and vLLM load it) and its adapter folder in ``adapter/``.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from torch import nn
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from grpo_lightning.models.allocator import trim_heap
from grpo_lightning.models.lora import is_peft_model, save_adapter, save_merged
from grpo_lightning.models.vision.processor import saved_with
from grpo_lightning.rollout.temp_folders import remove_dead_owners

ADAPTER_FOLDER = "adapter"  # a LoRA policy's adapter folder, inside the exported one


def export_hf(
    policy: nn.Module, tokenizer: PreTrainedTokenizerBase, folder: str | Path, state: dict | None = None
) -> Path:
    """Write ``policy`` and ``tokenizer`` to ``folder`` (replaced if it exists); returns the folder.

    A LoRA policy is written merged (a plain transformers folder) with its adapter folder in
    ``folder/adapter`` (``PeftModel.from_pretrained``). ``state``: the policy's whole weights
    when it is sharded (:func:`~grpo_lightning.models.lora.full_state_dict`, gathered on every rank).
    """
    folder = Path(folder)
    trim_heap()  # the training passes' freed blocks back to the OS before the merged copies are made
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.tmp{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    _remove_abandoned(folder)
    # No progress bar: one line of noise per export, and inside a Jupyter kernel tqdm's
    # write can recurse until the export fails (seen in notebooks/quickstart.ipynb).
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        save_merged(policy, staging, state=state)  # config, weights, generation config
        if is_peft_model(policy):
            save_adapter(policy, staging / ADAPTER_FOLDER, state=state)
        saved_with(tokenizer).save_pretrained(staging)  # a VLM's processor (tokenizer, image processor)
        generation = getattr(policy, "generation_config", None)
        if generation is not None and not (staging / "generation_config.json").exists():
            generation.save_pretrained(staging)
    except BaseException:  # disk full, a kill: no half folder left behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if folder.exists():
        old = folder.parent / f".{folder.name}.old{os.getpid()}"
        folder.rename(old)
        staging.rename(folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(folder)
    return folder


def _remove_abandoned(folder: Path) -> None:
    """Remove the staging and replaced copies (``.<name>.tmp<pid>``, ``.<name>.old<pid>``) that an
    export killed mid-write left next to ``folder``: each is a whole model on disk, and its process
    is gone. A folder whose process still runs (or whose pid a new process took) is kept; pids are
    this machine's (one run writes an output folder at a time)."""
    owner = re.compile(rf"\.{re.escape(folder.name)}\.(?:tmp|old)(\d+)$")
    remove_dead_owners(folder.parent, f".{folder.name}.*", owner)
