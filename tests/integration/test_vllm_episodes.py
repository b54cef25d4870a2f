"""Episodes on vLLM (in process, the session's engine): each turn's prompt ids go in as ids, the sampled
ids and vLLM's log-probs come back aligned with the trainer's, and the run trains."""

from __future__ import annotations

import pytest

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.tasks.guess_number import GuessNumberTaskConfig


@pytest.mark.slow
def test_guess_number_trains_on_vllm_with_aligned_engine_logprobs(vllm_session, tmp_path):
    cfg = TrainConfig()
    cfg.task = GuessNumberTaskConfig()
    cfg.logger.kind, cfg.trainer.output_dir, cfg.trainer.max_steps = "none", str(tmp_path), 1
    cfg.rollout.engine, cfg.rollout.num_generations, cfg.rollout.prompts_per_step = "vllm", 4, 2
    cfg.rollout.max_new_tokens, cfg.rollout.vllm.max_model_len = 3, 128
    run = build_run(cfg, engine=vllm_session.engine)
    trainer = run.trainer(cfg, enable_progress_bar=False)
    trainer.fit(run.module, datamodule=run.datamodule)
    step = run.module.last_step
    rollout, stats = step.rollout, step.passes[0]
    assert rollout.loss_mask is not None and rollout.engine_logprobs is not None
    assert stats.engine_tokens == float(rollout.loss_mask.sum()) > 0  # mismatch measured on sampled ids only
    assert stats.logp_diff_sum / stats.engine_tokens < 1e-2  # vLLM's log-probs line up with the trainer's
    assert run.module.last_metrics["rollout/episodes/count"] == 8  # 2 prompts x 4 episodes
