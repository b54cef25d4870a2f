"""``model=tiny_vlm``: a small vision-language policy built in code, of either supported family.

No VLM weights can be downloaded here, so the tests, the demo and the benchmarks build one: a
character tokenizer over printable ASCII plus the image special tokens and a chat template, a
2-layer text model with head_dim 32 (vLLM's CPU attention needs head_dim >= 32), a small vision
tower, and the family's own processor (PIL image processors: no torchvision). Saved with
``save_pretrained`` it is a folder like any Hugging Face VLM's, loaded through exactly the path a
user's folder takes (:func:`grpo_lightning.models.vision.loading.load_vision_policy`).
"""

from __future__ import annotations

import string

import torch
from torch import nn
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
)

from grpo_lightning.models.tiny import BOS, EOS, PAD, build_char_tokenizer, text_config
from grpo_lightning.models.vision import compat

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END, IMAGE = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
SPECIAL = [PAD, BOS, EOS, IM_START, IM_END, VISION_START, VISION_END, IMAGE]
ALPHABET = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")  # printable ASCII, newline and space
TINY_VLM_CONTEXT = 256  # max_position_embeddings: a few images' tokens, a question and the answer
TINY_FAMILIES = ("llava", "qwen2_vl")

# Where each family's chat template puts an image (the processor expands the image token).
IMAGE_MARKUP = {"llava": IMAGE, "qwen2_vl": VISION_START + IMAGE + VISION_END}


def chat_template(family: str) -> str:
    """A Qwen-style template: ``{"type": "image"}`` parts become the family's image markup."""
    part = (
        "{%- if p['type'] == 'image' -%}" + IMAGE_MARKUP[family] + "{%- elif p['type'] == 'text' -%}{{ p['text'] }}"
        "{%- endif -%}"
    )
    return (
        "{%- for m in messages -%}" + IM_START + "{{ m['role'] }}\n"
        "{% if m['content'] is string -%}{{ m['content'] }}{%- else -%}{%- for p in m['content'] -%}"
        + part
        + "{%- endfor -%}{%- endif -%}"
        + IM_END
        + "\n{% endfor -%}{%- if add_generation_prompt -%}"
        + IM_START
        + "assistant\n{% endif -%}"
    )


def build_vision_tokenizer(family: str = "llava") -> PreTrainedTokenizerFast:
    """One token per printable ASCII character, plus pad, bos, eos and the chat and image tokens."""
    tokenizer = build_char_tokenizer(ALPHABET, tuple(SPECIAL[3:]), extra_special_tokens={"image_token": IMAGE})
    tokenizer.chat_template = chat_template(family)
    return tokenizer


def build_tiny_processor(tokenizer: PreTrainedTokenizerFast, family: str, image_size: int, patch_size: int):
    """The family's processor over ``tokenizer``: every image resized to ``image_size`` squared."""
    compat.apply()
    template = chat_template(family)
    tokenizer.chat_template = template
    if family == "llava":
        side = {"height": image_size, "width": image_size}
        return LlavaProcessor(
            image_processor=CLIPImageProcessorPil(size={"shortest_edge": image_size}, crop_size=side),
            tokenizer=tokenizer,
            patch_size=patch_size,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,  # CLIP's class token, dropped by the "default" strategy
            image_token=IMAGE,
            chat_template=template,
        )
    pixels = image_size * image_size
    images = Qwen2VLImageProcessorPil(
        min_pixels=pixels, max_pixels=pixels, patch_size=patch_size, merge_size=2, temporal_patch_size=2
    )
    return Qwen2VLProcessor(image_processor=images, tokenizer=tokenizer, chat_template=template)


def build_tiny_vlm(
    tokenizer: PreTrainedTokenizerFast,
    family: str = "llava",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    vision_layers: int = 1,
    image_size: int = 32,
    patch_size: int = 8,
    seed: int = 0,
):
    """A randomly initialised float32 VLM of ``family`` and its processor: ``(model, processor)``."""
    compat.apply()
    if family not in TINY_FAMILIES:
        raise ValueError(f"model.tiny_vlm.family={family!r}: choose one of {list(TINY_FAMILIES)}")
    image = tokenizer.convert_tokens_to_ids(IMAGE)
    if family == "llava":
        vision = CLIPVisionConfig(
            hidden_size=hidden_size,
            intermediate_size=hidden_size * 2,
            num_hidden_layers=vision_layers,
            num_attention_heads=num_heads,
            image_size=image_size,
            patch_size=patch_size,
            projection_dim=hidden_size,
        )
        config = LlavaConfig(
            vision_config=vision,
            text_config=LlamaConfig(**text_config(tokenizer, hidden_size, num_layers, num_heads, TINY_VLM_CONTEXT)),
            image_token_index=image,
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
            tie_word_embeddings=False,
        )
        model_cls = LlavaForConditionalGeneration
    else:
        head = hidden_size // num_heads
        rope = {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [head // 8, 3 * head // 16, 3 * head // 16],
        }
        config = Qwen2VLConfig(
            text_config=text_config(
                tokenizer, hidden_size, num_layers, num_heads, TINY_VLM_CONTEXT, rope_parameters=rope
            ),
            vision_config=dict(
                depth=vision_layers,
                embed_dim=hidden_size,
                hidden_size=hidden_size,
                num_heads=num_heads,
                mlp_ratio=2,
                patch_size=patch_size,
                spatial_merge_size=2,
                temporal_patch_size=2,
            ),
            image_token_id=image,
            video_token_id=image,  # no videos: the tokenizer has no video token
            vision_start_token_id=tokenizer.convert_tokens_to_ids(VISION_START),
            vision_end_token_id=tokenizer.convert_tokens_to_ids(VISION_END),
            tie_word_embeddings=False,
        )
        model_cls = Qwen2VLForConditionalGeneration
    config.architectures = [model_cls.__name__]
    processor = build_tiny_processor(tokenizer, family, image_size, patch_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
        if family == "llava":
            # CLIP draws its learned position embeddings at std 0.02, far below a patch's content: a
            # random tower then barely tells where a patch is, and "which side?" stays at chance.
            nn.init.normal_(model.model.vision_tower.embeddings.position_embedding.weight, std=1.0)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, processor
