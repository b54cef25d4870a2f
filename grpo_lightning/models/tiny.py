"""A tiny Llama policy and a character tokenizer, built in code: no download, ever.

head_dim is 32 so that vLLM's CPU attention backend accepts the model too (it supports
head_dim >= 32 only). The tokenizer is a real ``PreTrainedTokenizerFast`` so that
``save_pretrained`` writes a folder any engine can load.
"""

from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
DEFAULT_ALPHABET = "0123456789+-*=? "
TINY_CONTEXT = 128  # max_position_embeddings of the tiny policy


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, special: tuple[str, ...] = (), **extra
) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet`` plus pad, bos and eos (ids 0, 1, 2), then the ``special``
    tokens (matched whole, before the characters: the tiny VLM's chat and image tokens); ``extra``: more
    arguments of ``PreTrainedTokenizerFast``."""
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for token in special:
        vocab.setdefault(token, len(vocab))
    for char in alphabet:
        vocab.setdefault(char, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Split into single characters, spaces included, so that decode(encode(x)) == x.
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    if special:
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=PAD,
        padding_side="left",
        **extra,
    )


def text_config(
    tokenizer, hidden_size: int, num_layers: int, num_heads: int, max_position_embeddings: int, **extra
) -> dict:
    """A tiny text model's config fields (the tiny policy's, the tiny VLM's text model's): head_dim >= 32."""
    if hidden_size % num_heads or hidden_size // num_heads < 32:
        raise ValueError(
            f"model.hidden_size / model.num_heads must be an integer >= 32 (vLLM's CPU "
            f"attention needs it), got {hidden_size} / {num_heads}"
        )
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        **extra,
    )


def build_tiny_policy(
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    max_position_embeddings: int = TINY_CONTEXT,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised Llama with ``hidden_size / num_heads`` >= 32 (float32)."""
    config = LlamaConfig(**text_config(tokenizer, hidden_size, num_layers, num_heads, max_position_embeddings))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
