"""A tiny sequence-classification reward model built in code and saved to a folder (no download).

Its transformer layers write nothing into the residual stream (output projections are zero), so
the score of a text is a fixed function of its last token: ``1.0`` for ``liked`` and a smaller
value for every other character. A policy trained on it should learn to end with ``liked``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from grpo_lightning.models import build_char_tokenizer


def tiny_config(tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        num_labels=1,
    )


def save_tiny_reward_model(folder: Path, liked: str = "7", chat_template: str | None = None) -> Path:
    tokenizer = build_char_tokenizer()
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    config = tiny_config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        target = model.model.norm(model.model.embed_tokens.weight[tokenizer.convert_tokens_to_ids(liked)])
        model.score.weight.copy_(target[None] / target.square().sum())  # score(liked) = 1, others < 1
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def save_tiny_causal_lm(folder: Path) -> Path:
    """The same shape as a causal language model: no ``score`` head (what issue 46 loaded as a reward model)."""
    tokenizer = build_char_tokenizer()
    LlamaForCausalLM(tiny_config(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)
