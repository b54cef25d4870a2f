"""Weight-sync time as a share of the training step, with the in-process vLLM engine.

Trains ``--model`` (default ``smollm2_135m``: SmolLM2-135M-Instruct, converted once into
``~/.cache/grpo_lightning``) with ``rollout.engine=vllm`` in process, on the SmolLM2 setting
of the TRL comparison (``trl_vs_ours.our_config``: 4 prompts x 8 generations x 64 tokens,
beta 0.04, gradient checkpointing, one thread), and reports per step, from step ``--skip`` on: the wall time of the whole
step (rollout, optimization, sync) and the seconds the generator's ``WeightSync`` spent pushing
the policy's weights into the engine. The baseline is our own step: the share is
sync / step. ``verify_sync`` is on, so each sync is also checked (the engine's log-probs of
a probe sequence against the policy's; the largest difference is reported) outside the
timed reload.

With ``--server`` the engine is a launched vLLM server (``rollout.vllm.server.launch``, the
engine DDP ranks share) and a sync goes through a safetensors folder and ``/collective_rpc``.

    python benchmarks/weight_sync.py [--model smollm2_135m] [--steps 6] [--skip 1] [--server]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import lightning as L
import torch
from trl_vs_ours import our_config  # the TRL comparison's SmolLM2 setting

from grpo_lightning.build import build_run
from grpo_lightning.rollout import WeightSync


class SyncTimes(L.Callback):
    """Step wall time and the sync seconds of that step.

    The module pushes the weights in its own ``on_train_batch_end``, after every callback's,
    so a step is timed from one ``on_train_batch_start`` to the next (and to ``on_train_end``
    for the last): the clock spans generation, the optimizer step and the weight push.
    """

    def __init__(self, sync: WeightSync):
        self.sync, self.steps, self.start = sync, [], None

    def _close_step(self) -> None:
        if self.start is None:
            return
        synced = self.sync.num_syncs > self.syncs
        self.steps.append(
            {
                "seconds": time.perf_counter() - self.start,
                "sync_seconds": self.sync.last_sync_seconds if synced else 0.0,
                "probe_diff": self.sync.last_probe_diff if synced else None,
            }
        )

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._close_step()
        self.start, self.syncs = time.perf_counter(), self.sync.num_syncs

    def on_train_end(self, trainer, module):
        self._close_step()


def sync_config(model: str, steps: int, server: bool):
    """The TRL comparison's SmolLM2 setting with ``model``, rolled out by vLLM (in process, or a launched
    server) with every sync verified."""
    cfg = our_config("smollm2", model, checkpointing=True, steps=steps)
    cfg.rollout.engine, cfg.rollout.vllm.verify_sync = "vllm", True
    cfg.rollout.vllm.server.launch = server
    return cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2_135m", help="model.name_or_path (smollm2_135m, tiny or a folder)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip", type=int, default=1, help="first steps left out (engine warm-up)")
    parser.add_argument("--json", default=None, help="default: benchmarks/results/weight_sync[_server].json")
    parser.add_argument(
        "--server", action="store_true", help="sync into a launched vLLM server instead of the in-process engine"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)

    cfg = sync_config(args.model, args.steps, args.server)
    args.json = args.json or f"benchmarks/results/weight_sync{'_server' if args.server else ''}.json"
    run = build_run(cfg)
    run.module.rollout.setup(run.module.policy)  # builds the engine, so its weight sync exists
    timer = SyncTimes(run.module.rollout.weight_sync)
    run.trainer(cfg, callbacks=[timer, *run.callbacks], enable_progress_bar=False, limit_val_batches=0).fit(
        run.module, datamodule=run.datamodule
    )
    measured = timer.steps[args.skip :]
    step = statistics.median(s["seconds"] for s in measured)
    sync_s = statistics.median(s["sync_seconds"] for s in measured)
    probe = max(s["probe_diff"] for s in measured if s["probe_diff"] is not None)
    run.module.rollout.shutdown()
    result = {
        "model": args.model,
        "engine": "server" if args.server else "in process",
        "steps_measured": len(measured),
        "median_step_s": step,
        "median_sync_s": sync_s,
        "sync_share": sync_s / step,
        "max_probe_diff": probe,
        "steps": measured,
    }
    print(
        f"model {args.model}, vLLM {'server' if args.server else 'in process'}, 4 prompts x 8 generations x 64 tokens, 1 thread"
    )
    print(
        f"median step {step:.2f} s, median weight sync {sync_s:.3f} s: {100 * sync_s / step:.2f}% of the step; "
        f"largest engine - policy probe log-prob difference after a sync: {probe:.1e}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
