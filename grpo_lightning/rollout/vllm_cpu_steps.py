"""On a CPU, vLLM must never split a prompt's prefill across two of its steps.

vLLM schedules at most ``max_num_batched_tokens`` tokens a step and, with chunked prefill (its
default), prefills a prompt that does not fit in pieces over several steps. After each piece it
rewinds the request's seeded generator (``Generator.set_offset``), which only CUDA generators
have: on a CPU the worker fails ("CPU Generator does not use offset"; a server answers HTTP 500).
Every request here carries its own seed, so any generation batch whose prompts hold more tokens
than one step takes failed: 16 prompts x 8 samples of the tiny VLM's shapes questions (~6000
tokens) already did. So on a CPU chunked prefill is off (a prompt that does not fit waits for the
next step, whole) and the step takes at least the longest sequence the engine accepts, which
vLLM requires once chunking is off. GPUs keep vLLM's defaults.
"""

from __future__ import annotations

import json
from pathlib import Path

from grpo_lightning.errors import ConfigError

CPU_MIN_STEP_TOKENS = 4096  # vLLM's own CPU default for the in-process engine


def model_context(model_dir: str | Path, max_model_len: int | None) -> int:
    """The longest sequence the engine will accept: ``max_model_len``, else the saved model's context."""
    if max_model_len is not None:
        return max_model_len
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config") or {}  # a vision-language model's language model
    return int(text.get("max_position_embeddings") or config.get("max_position_embeddings") or CPU_MIN_STEP_TOKENS)


def cpu_step_tokens(model_dir: str | Path, max_model_len: int | None, max_num_batched_tokens: int | None) -> int:
    """The tokens of one vLLM step on a CPU: the user's ``rollout.vllm.max_num_batched_tokens`` (refused
    below the context, where a prompt could not fit one step), else the larger of vLLM's default and
    the context."""
    context = model_context(model_dir, max_model_len)
    if max_num_batched_tokens is None:
        return max(CPU_MIN_STEP_TOKENS, context)
    if max_num_batched_tokens < context:
        raise ConfigError(
            f"rollout.vllm.max_num_batched_tokens={max_num_batched_tokens} is below the engine's context of "
            f"{context} tokens: on a CPU every prompt must fit one vLLM step (vLLM's CPU sampler cannot split a "
            "seeded prompt); raise it, lower rollout.vllm.max_model_len, or leave it null"
        )
    return max_num_batched_tokens
