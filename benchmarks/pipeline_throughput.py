"""Completions per second, and where each second went, for rollout.mode=sync, async and pipeline
(issue 50, docs/pipeline.md).

Each mode trains the tiny in-code policy on the default arithmetic task for ``--steps`` steps with
the HF engine, configured as the CLI composes it (``compose``), with a length spread: the random
policy ends a completion at its end token with a small chance per token, so most completions are
short and some run to ``--max-new-tokens``. The modes:

- ``sync``: the policy decodes its own batch, then trains (``hf_decoder=fused``);
- ``async``: the whole next batch is generated in the background while the module trains
  (``max_staleness=1``); its engine is the pipeline's HF engine (the same fused decoder over a
  generation copy of the weights), called a batch at a time, since the sync HF engine decodes
  with the weights being trained;
- ``pipeline``: the producer keeps ``(max_lag + 1) x prompts_per_step`` groups in flight and the
  weights change between decode steps (``--max-lags``).

``--engine vllm``: the same three modes with a CPU vLLM server (launched once on the tiny policy,
or ``--server-url`` with its token in ``GRPO_BENCH_SERVER_KEY``) behind every run: sync and async
send whole batches, pipeline keeps requests in flight and pauses the server at each weight sync.

Rounds interleave the modes so machine load hits all alike; the median round is reported with
its ratio to sync, and the median of each round's ratio to that round's sync run. Per run: wall seconds of ``fit`` (building excluded), completions per second,
the trainer's wait (sync: generating; async: waiting for the batch; pipeline: waiting for finished
groups) and busy seconds, and the pipeline's engine busy / idle / sync seconds, which add up to
its wall clock. Usage: ``python benchmarks/pipeline_throughput.py [--steps 8] [--rounds 3]
[--max-new-tokens 48] [--prompts 8] [--generations 4] [--max-lags 1 2] [--engine hf|vllm]
[--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings

import lightning as L
import torch

from grpo_lightning.build import build_run
from grpo_lightning.config.compose import compose
from grpo_lightning.models import load_policy
from grpo_lightning.rollout.pipeline.hf_engine import HFPipelineEngine

KEY_ENV = "GRPO_BENCH_SERVER_KEY"  # the server's token, for --server-url and the launched one


class Timings(L.Callback):
    """Each batch's rollout timing (the wait, the engine's clock) and its completions' lengths."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []
        self.lengths: list[int] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rollout = pl_module.last_step.rollout
        self.rows.append(dict(rollout.timing))
        self.lengths += rollout.completion_mask.sum(dim=1).long().tolist()


def overrides(mode: str, lag: int, args) -> list[str]:
    shared = [
        f"trainer.max_steps={args.steps}",
        f"rollout.prompts_per_step={args.prompts}",
        f"rollout.num_generations={args.generations}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        "logger=none",
        "logger.report_png=false",
        "eval.before_training=false",
        "eval.every_n_steps=0",
        "trainer.checkpoint_every_n_steps=0",
        f"trainer.output_dir={args.output_dir}/{mode}{lag}",
    ]
    if args.server_url:  # every mode on the vLLM server
        shared += ["rollout.engine=vllm", f"rollout.vllm.server.url={args.server_url}"]
        shared.append(f"rollout.vllm.server.api_key_env={KEY_ENV}")
    if mode == "async":  # a background engine: engine=vllm's async path (hf: the HF pipeline engine injected)
        return [*shared, "rollout.engine=vllm", "rollout.mode=async", "rollout.max_staleness=1"]
    if mode == "pipeline":
        return [*shared, "rollout.mode=pipeline", f"rollout.pipeline.max_lag={lag}"]
    return shared


def run_once(mode: str, lag: int, args) -> dict[str, float]:
    cfg, _ = compose(overrides(mode, lag, args))
    engine = None
    if mode == "async" and not args.server_url:
        policy, tokenizer = load_policy(cfg.model)
        engine = HFPipelineEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, 256)
    run = build_run(cfg, engine=engine)
    timings = Timings()
    trainer = run.trainer(cfg, callbacks=[*run.callbacks, timings], enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        trainer.fit(run.module, datamodule=run.datamodule)
        wall = time.perf_counter() - start
    run.module.rollout.shutdown()
    if engine is not None:
        engine.close()
    rows = timings.rows
    if mode == "sync":
        wait = engine_busy = sum(r["rollout/seconds"] for r in rows)
    elif mode == "async":
        wait, engine_busy = sum(r["rollout/wait_seconds"] for r in rows), sum(r["rollout/seconds"] for r in rows)
    else:
        wait, engine_busy = (sum(r[f"pipeline/{k}_seconds"] for r in rows) for k in ("trainer_wait", "engine_busy"))
    result = {
        "wall_s": wall,
        "completions_per_s": len(timings.lengths) / wall,
        "trainer_wait_s": wait,
        "trainer_busy_s": wall - wait,
        "trainer_wait_fraction": wait / wall,
        "engine_busy_s": engine_busy,
        "engine_busy_fraction": engine_busy / wall,
        "mean_length": statistics.mean(timings.lengths),
        "at_limit_fraction": sum(n == args.max_new_tokens for n in timings.lengths) / len(timings.lengths),
    }
    if mode == "pipeline":
        for key in ("engine_idle", "engine_sync", "cycle"):
            result[f"{key}_s"] = sum(r[f"pipeline/{key}_seconds"] for r in rows)
        result["lag_max"] = max(r["pipeline/lag_max"] for r in rows)
        result["multi_version_seqs"] = statistics.mean(r["pipeline/multi_version_seqs"] for r in rows)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-lags", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", default=["sync", "async", "pipeline"])
    parser.add_argument("--output-dir", default="/tmp/pipeline_throughput")
    parser.add_argument("--out", default=None)
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--server-url", default=None, help=f"--engine vllm: a running server (token in {KEY_ENV})")
    args = parser.parse_args()
    server = None
    if args.engine == "vllm" and not args.server_url:
        server = launch_server()
        args.server_url = server.client.url
    try:
        measure(args)
    finally:
        if server is not None:
            server.close()


def launch_server():
    """A CPU vLLM server on the tiny policy, for every run (each pushes its own weights first)."""
    from grpo_lightning.config import VLLMConfig, VLLMServerConfig  # noqa: PLC0415  (--engine vllm only)
    from grpo_lightning.rollout.vllm_server import VLLMServerEngine  # noqa: PLC0415

    cfg, _ = compose(["trainer.output_dir=/tmp/unused"])
    policy, tokenizer = load_policy(cfg.model)
    settings = VLLMConfig(max_model_len=128, kv_cache_gib=0.5, server=VLLMServerConfig(launch=True, timeout_s=120))
    engine = VLLMServerEngine.from_policy(policy, tokenizer, settings, seed=0)
    os.environ[KEY_ENV] = engine.server.token
    return engine


def measure(args) -> None:
    settings = [(m, lag) for m in args.modes for lag in (args.max_lags if m == "pipeline" else [0])]
    runs: dict[str, list[dict]] = {f"{m}{lag if m == 'pipeline' else ''}": [] for m, lag in settings}
    for _ in range(args.rounds):
        for mode, lag in settings:
            runs[f"{mode}{lag if mode == 'pipeline' else ''}"].append(run_once(mode, lag, args))
    median = {
        name: min(rs, key=lambda r: abs(r["wall_s"] - statistics.median(x["wall_s"] for x in rs)))
        for name, rs in runs.items()
    }
    base = median.get("sync")
    print(f"{'mode':<10} {'wall s':>7} {'compl/s':>8} {'vs sync':>8} {'wait frac':>9} {'engine busy':>11}")
    for name, r in median.items():
        ratio = r["completions_per_s"] / base["completions_per_s"] if base else float("nan")
        r["vs_sync"] = ratio
        print(
            f"{name:<10} {r['wall_s']:7.2f} {r['completions_per_s']:8.1f} {ratio:8.2f} "
            f"{r['trainer_wait_fraction']:9.2f} {r['engine_busy_fraction']:11.2f}"
        )
    # Each round's ratio to that round's sync run (the machine's load changes between rounds): their median.
    if "sync" in runs:
        for name, rs in runs.items():
            ratios = [r["completions_per_s"] / s["completions_per_s"] for r, s in zip(rs, runs["sync"], strict=True)]
            median[name]["vs_sync_per_round"] = ratios
            median[name]["vs_sync_round_median"] = statistics.median(ratios)
            print(f"{name:<10} per-round ratio to sync: median {statistics.median(ratios):.2f}, "
                  f"range {min(ratios):.2f}-{max(ratios):.2f}")  # fmt: skip
    cpu = platform.processor() or platform.machine()
    out = {
        "cpu": cpu,
        "engine": args.engine,
        "torch_threads": torch.get_num_threads(),
        "args": vars(args),
        "median": median,
        "runs": runs,
    }
    print("RESULT " + json.dumps({k: v["completions_per_s"] for k, v in median.items()}))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
