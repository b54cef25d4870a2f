"""The Qwen2-VL family (Qwen2-VL, Qwen2.5-VL): patches merged into image tokens, 3-D positions.

Positions are multimodal rotary positions (M-RoPE): a text token gets (p, p, p); an image with
merged grid (T, H, W) gets (s + t, s + row, s + column) from the position ``s`` after the text
before it; the next text token continues from the largest position so far plus one. So a
completion's positions are not its token indices: they continue from its prompt's largest
position, and positions counted from 0 or from the attention mask would give wrong log-probs
without an error. Every pass computes them here, from the prompt's image tokens and grids
(the model's ``get_rope_index``); an image token the policy sampled in its completion is text.
"""

from __future__ import annotations

import torch
from torch import nn

from grpo_lightning.models.vision.families import VISION_FAMILIES, VisionFamily, cat_tensor, split_per_prompt
from grpo_lightning.records import VisionInputs


class Qwen2VLFamily(VisionFamily):
    model_types = ("qwen2_vl", "qwen2_5_vl")
    vision_prefixes = ("model.visual.",)  # the tower and its patch merger
    multimodal_positions = True

    def image_features(self, model: nn.Module, inputs: list[VisionInputs]) -> list[torch.Tensor]:
        pixels, grid = cat_tensor(inputs, "pixel_values"), cat_tensor(inputs, "image_grid_thw")
        features = model.model.get_image_features(pixels, grid, return_dict=True).pooler_output
        return split_per_prompt(list(features), inputs)

    def image_tokens(self, config, inputs: VisionInputs) -> list[int]:
        merge = config.vision_config.spatial_merge_size
        return (inputs.tensors["image_grid_thw"].prod(dim=-1) // merge**2).tolist()

    def positions(
        self, model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, image_mask: torch.Tensor, rows: list
    ) -> torch.Tensor:
        grids = [v.tensors["image_grid_thw"] for v in rows if v is not None and v.num_images]
        if not grids:  # text only: the three rows are the 1-D positions
            text = super().positions(model, ids, mask, image_mask, rows)
            return text[None].expand(3, -1, -1)
        # The grids in row order, each row's own (a group's rows repeat their prompt's).
        positions, _ = model.model.get_rope_index(
            ids, image_mask.int(), image_grid_thw=torch.cat(grids).to(ids.device), attention_mask=mask
        )
        return positions


VISION_FAMILIES.add("qwen2_vl", Qwen2VLFamily())
