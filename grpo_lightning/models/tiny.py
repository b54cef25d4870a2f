"""A tiny Llama policy and a character tokenizer, built in code: no download, ever.

head_dim is 32 so that vLLM's CPU attention backend accepts the model too (it supports
head_dim >= 32 only). The tokenizer is a real ``PreTrainedTokenizerFast`` so that
``save_pretrained`` writes a folder any engine can load.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
DEFAULT_ALPHABET = "0123456789+-*=? "
TINY_CONTEXT = 128  # max_position_embeddings of the tiny policy


def build_char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """One token per character of ``alphabet`` plus pad, bos and eos (ids 0, 1, 2)."""
    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for char in alphabet:
        vocab.setdefault(char, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Split into single characters, spaces included, so that decode(encode(x)) == x.
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=PAD,
        padding_side="left",
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
    if hidden_size % num_heads or hidden_size // num_heads < 32:
        raise ValueError(
            f"model.hidden_size / model.num_heads must be an integer >= 32 (vLLM's CPU "
            f"attention needs it), got {hidden_size} / {num_heads}"
        )
    config = LlamaConfig(
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
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
