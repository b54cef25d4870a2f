"""One "node" of test_two_nodes.py: ``python two_node_worker.py OUT_DIR STEPS`` with the
environment a cluster launcher sets (MASTER_ADDR, MASTER_PORT, NODE_RANK, LOCAL_RANK=0), so
Lightning joins the job instead of starting processes (num_nodes=2, devices=1, DDP on gloo).
Each node trains in its own OUT_DIR (no shared file system) and writes ``rank.json`` there."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import torch

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig


def main(out_dir: str, steps: int) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    cfg = TrainConfig()
    cfg.trainer.max_steps = steps
    cfg.trainer.devices, cfg.trainer.num_nodes = 1, 2
    cfg.trainer.checkpoint_every_n_steps = steps
    cfg.logger.kind = "none"
    cfg.eval.before_training, cfg.eval.num_prompts = False, 4
    cfg.trainer.output_dir = out_dir
    run = build_run(cfg)
    trainer = run.trainer(cfg, enable_progress_bar=False, strategy="ddp")
    trainer.fit(run.module, datamodule=run.datamodule)
    report = {
        "global_rank": trainer.global_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "checksum": float(sum(p.detach().double().sum() for p in run.module.policy.parameters())),
    }
    Path(out_dir).mkdir(parents=True, exist_ok=True)  # only rank 0 writes into its run folder
    Path(out_dir, "rank.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
