"""A LoRA policy trains with the in-process vLLM engine: every sync pushes the merged weights
and the engine's probe log-probs match the policy's (verify_sync); the base weights stay put."""

from __future__ import annotations

import pytest
import torch
from helpers.vllm_helpers import small_config

from grpo_lightning.build import build_run
from grpo_lightning.models.lora import merged_state_dict
from grpo_lightning.rollout.weight_sync import WeightSync, WeightSyncError
from grpo_lightning.step.weight_push import probe_scores


def test_lora_training_syncs_merged_weights_that_verify(vllm_session):
    cfg = small_config(3, lr=1e-2)
    cfg.model.lora.rank = 8
    run = build_run(cfg, engine=vllm_session.engine)
    base_before = {n: p.detach().clone() for n, p in run.module.policy.named_parameters() if not p.requires_grad}
    trainer = run.trainer(cfg, enable_progress_bar=False)
    trainer.fit(run.module, datamodule=run.datamodule)
    sync = run.rollout.weight_sync
    # on_train_start plus one per step, each checked against the policy within 1e-4
    assert sync.num_syncs == 4 and sync.last_probe_diff is not None and sync.last_probe_diff <= 1e-4
    policy = run.module.policy
    moved = [n for n, p in policy.named_parameters() if "lora_B" in n and p.abs().max() > 0]
    assert moved, "the adapters did not train"
    assert all(torch.equal(base_before[n], p) for n, p in policy.named_parameters() if not p.requires_grad)
    # The check has teeth: the base weights alone (adapters not merged) fail it.
    base = policy.get_base_model().state_dict().items()
    vllm_session.engine.load_weights((n.replace(".base_layer.", "."), t) for n, t in base if ".lora_" not in n)
    with pytest.raises(WeightSyncError):
        WeightSync(verify=True, tolerance=1e-4).check(
            vllm_session.engine, probe_scores(run.module, tokenizer=run.tokenizer)
        )
    vllm_session.engine.load_weights(merged_state_dict(policy).items())
    assert (
        WeightSync(verify=True, tolerance=1e-4).check(
            vllm_session.engine, probe_scores(run.module, tokenizer=run.tokenizer)
        )
        <= 1e-4
    )
