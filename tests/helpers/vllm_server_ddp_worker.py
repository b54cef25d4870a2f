"""Worker for test_vllm_server_ddp.py: 2 DDP ranks (gloo) sharing one vLLM server.

``python tests/helpers/vllm_server_ddp_worker.py URL OUT_DIR STEPS KEY_ENV`` (KEY_ENV: the environment variable holding the server's token); Lightning's ``ddp`` strategy
re-runs this script for rank 1. Both ranks get the same prompts every step (so the
cross-rank duplicates check has shares of the same groups to compare) and sample with their
own seeds. Each rank writes ``rank_<r>.json``: mean reward per step, weight-version lags,
the probe differences of its syncs, the health alerts and the duplicates metrics.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import lightning as L
import torch

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.rewards import register_reward

sys.path.insert(0, str(Path(__file__).parent))
from ddp_fit_worker import SharedPromptsDataModule  # noqa: E402


@register_reward("test_long")
def long_completions(prompts, completions, **_):
    """Learnable in a few steps by the tiny policy: the longer the completion, the better."""
    return [min(len(c), 8) / 8 for c in completions]


class Record(L.Callback):
    def __init__(self):
        self.rewards, self.lags, self.probe_diffs = [], [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        rollout = module.last_step.rollout
        self.rewards.append(float(rollout.rewards.mean()))
        self.lags.append(trainer.global_step - 1 - rollout.weight_version)

    def on_train_end(self, trainer, module):
        sync = module.rollout.weight_sync
        self.probe_diffs.append(sync.last_probe_diff)
        self.syncs = sync.num_syncs


def main(url: str, out_dir: str, steps: int, key_env: str) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    cfg = TrainConfig()
    cfg.logger.kind = "none"
    cfg.trainer.output_dir = out_dir  # its own run folder (locked), never the repository's outputs/
    cfg.trainer.max_steps, cfg.trainer.devices = steps, 2
    cfg.task.rewards = {"test_long": 1.0}
    cfg.rollout.engine, cfg.rollout.vllm.server.url = "vllm", url
    cfg.rollout.vllm.server.api_key_env = key_env
    cfg.rollout.prompts_per_step, cfg.rollout.num_generations, cfg.rollout.max_new_tokens = 4, 8, 8
    cfg.rollout.vllm.verify_sync, cfg.rollout.vllm.verify_tolerance = True, 1e-4
    cfg.algorithm.micro_batch_size, cfg.algorithm.lr, cfg.algorithm.beta = 32, 5e-3, 0.0
    cfg.eval.num_prompts = 0
    run = build_run(cfg)
    dm = run.datamodule
    data = SharedPromptsDataModule(dm.train_records, dm.val_records, dm.prompts_per_step, dm.seed, dm.num_batches)
    record = Record()
    trainer = run.trainer(cfg, strategy="ddp", callbacks=[*run.callbacks, record], enable_progress_bar=False)
    trainer.fit(run.module, datamodule=data)
    report = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "rewards": record.rewards,
        "lags": record.lags,
        "syncs": record.syncs,
        "last_probe_diff": record.probe_diffs[-1],
        "alerts": [a.check for a in run.health.alerts],
        "duplicates": {k: v for k, v in run.health.last_metrics.items() if k.startswith("health/duplicates/")},
    }
    Path(out_dir, f"rank_{trainer.global_rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
