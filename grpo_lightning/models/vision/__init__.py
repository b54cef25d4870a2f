"""Vision-language policies: the families, the tiny in-code VLM, loading, freezing and the passes."""

from grpo_lightning.models.vision import llava, qwen2_vl  # noqa: F401  (register the families)
from grpo_lightning.models.vision.families import VISION_FAMILIES, VisionFamily, family_of, is_vision_config

__all__ = ["VISION_FAMILIES", "VisionFamily", "family_of", "is_vision_config"]
