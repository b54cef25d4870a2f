"""The LLaVA family: a vision tower, a projector, each image expanded into a fixed run of image
tokens in the text; 1-D positions as a text model's.

vLLM names the tower's weights as the checkpoints on the Hub do (``vision_tower.vision_model.*``);
transformers 5 keeps CLIP's and SigLIP's towers without the ``vision_model`` level
(``model.vision_tower.embeddings...``) and writes them so, which vLLM's loader rejects: the
weight sync and the engine's folder put the level back (:meth:`LlavaFamily.engine_name`).
"""

from __future__ import annotations

import torch
from torch import nn

from grpo_lightning.models.vision.families import VISION_FAMILIES, VisionFamily, cat_tensor, split_per_prompt
from grpo_lightning.records import VisionInputs

_TOWER = "model.vision_tower."


class LlavaFamily(VisionFamily):
    model_types = ("llava",)
    vision_prefixes = (_TOWER, "model.multi_modal_projector.")

    def image_features(self, model: nn.Module, inputs: list[VisionInputs]) -> list[torch.Tensor]:
        c = model.config
        features = model.model.get_image_features(
            cat_tensor(inputs, "pixel_values"),
            vision_feature_layer=c.vision_feature_layer,
            vision_feature_select_strategy=c.vision_feature_select_strategy,
            return_dict=True,
        ).pooler_output
        return split_per_prompt(list(features), inputs)

    def engine_name(self, name: str) -> str:
        if name.startswith(_TOWER) and not name.startswith(_TOWER + "vision_model."):
            return _TOWER + "vision_model." + name.removeprefix(_TOWER)
        return name


VISION_FAMILIES.add("llava", LlavaFamily())
