"""The up-front memory check counts the step's batch and the health checks' share of it (issue 46):
``rollout.num_generations=100000`` was accepted, generated for 11 minutes, then failed allocating
149 GiB in a health check. The checks are linear in the batch now (tests/unit/health/test_counting.py),
and so is what the estimate adds for them."""

from __future__ import annotations

import pytest

from grpo_lightning.config import TrainConfig
from grpo_lightning.errors import ConfigError
from grpo_lightning.models import memory

SMOLLM2 = memory.Shape(params=135 * 10**6, hidden=576, layers=30, vocab=49_152, kv_width=192, bytes_per_param=4)


def batch_part(cfg) -> int:
    (part,) = [v for k, v in memory.step_bytes(cfg, SMOLLM2).items() if k.startswith("the batch of")]
    return part


def test_the_batch_and_its_health_checks_are_counted_linearly_in_the_group_size():
    cfg = TrainConfig()
    cfg.rollout.max_new_tokens = 256
    sizes = {g: batch_part(_with(cfg, g)) for g in (8, 80, 800)}
    assert sizes[80] == pytest.approx(10 * sizes[8]) and sizes[800] == pytest.approx(10 * sizes[80])


def test_a_hundred_thousand_generations_are_refused_up_front_naming_the_batch():
    cfg = _with(TrainConfig(), 100_000)
    cfg.rollout.max_new_tokens = 512
    with pytest.raises(ConfigError) as refused:
        memory.check_memory(cfg, SMOLLM2, available=(16 * memory.GIB, "of CPU memory available"))
    said = str(refused.value)
    assert "the batch of 1600000 sequences (tensors, texts, health checks)" in said
    assert "rollout.num_generations=100000" in said and len(said.splitlines()) == 1


def _with(cfg: TrainConfig, generations: int) -> TrainConfig:
    cfg.rollout.num_generations = generations
    return cfg
