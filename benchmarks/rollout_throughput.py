"""Rollout throughput and async gain: the HF engine's decoders vs vLLM (in process, and a server) on the tiny policy or SmolLM2.

Baselines, all on the same machine and the same policy (tiny in-code Llama, float32):

1. rollout tokens/s for one generation batch of 32 prompts x 8 samples x 64 new tokens: the
   HF engine with each of ``--decoders`` (``rollout.hf_decoder``: ``fused``, the default;
   ``loop``, the same loop over the model's forward; ``generate``, per-sample seeded sampling
   inside ``model.generate``) vs the vLLM engine (one seeded request per sample), same prompts
   and seeds; a warm-up batch each, then the median of ``--repeats`` batches, the engines
   interleaved so machine load hits all alike;
   With ``--server`` a launched vLLM server (``rollout.vllm.server.launch``, the engine every
   rank shares under DDP) is measured the same way, requests sent concurrently;
2. the vLLM engine's start time (folder written, ``LLM`` built) and the seconds of one
   in-memory weight sync (``reload_weights`` + prefix-cache reset); with ``--server`` the
   server's start time and the seconds of one sync through it (safetensors folder written,
   ``/collective_rpc reload_weights``, prefix-cache reset, version set);
3. the training step time on the default task (``grpo_lightning/conf`` defaults, rollout.engine=vllm) in
   sync mode vs async mode (one step stale), measured from step ``--skip`` on so the engine
   start and the first steps are not counted; ``--rounds`` runs of each mode, alternated.

Usage: ``python benchmarks/rollout_throughput.py [--steps 60] [--threads 1] [--server]
[--model smollm2_135m] [--no-vllm]``; prints a table and writes JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import lightning as L
import torch

from grpo_lightning.build import build_run
from grpo_lightning.config import ModelConfig, RolloutConfig, TrainConfig, VLLMConfig, VLLMServerConfig
from grpo_lightning.models import load_policy
from grpo_lightning.rollout import GenerationRequest, HFEngine, Sampling
from grpo_lightning.rollout.seeding import group_seeds
from grpo_lightning.rollout.vllm import VLLMEngine
from grpo_lightning.rollout.vllm_server import VLLMServerEngine


def rollout_requests(tokenizer, num_prompts: int, num_samples: int, step: int) -> list[GenerationRequest]:
    prompts = [f"{a}+{b}=" for a, b in zip(range(num_prompts), reversed(range(num_prompts)), strict=True)]
    seeds = group_seeds(0, 0, step, num_prompts, num_samples)
    ids = [tokenizer(p)["input_ids"] for p in prompts for _ in range(num_samples)]
    return [GenerationRequest(i, s) for i, s in zip(ids, seeds, strict=True)]


def throughput(engines: dict, tokenizer, sampling: Sampling, repeats: int, num_prompts: int, num_samples: int) -> dict:
    """Median tokens/s and batch seconds per engine, batches interleaved engine after engine.

    Interleaving puts both engines under the same machine load (the cores are shared), and
    both sample the same prompts with the same per-sample seeds.
    """
    for engine in engines.values():
        engine.generate(rollout_requests(tokenizer, num_prompts, num_samples, step=999), sampling)  # warm-up
    rates = {name: [] for name in engines}
    seconds = {name: [] for name in engines}
    for step in range(repeats):
        requests = rollout_requests(tokenizer, num_prompts, num_samples, step)
        for name, engine in engines.items():
            start = time.perf_counter()
            completions = engine.generate(requests, sampling)
            elapsed = time.perf_counter() - start
            rates[name].append(sum(len(c.token_ids) for c in completions) / elapsed)
            seconds[name].append(elapsed)
    return {
        name: {"tokens_per_s": statistics.median(rates[name]), "batch_seconds": statistics.median(seconds[name])}
        for name in engines
    }


class StepTimer(L.Callback):
    """Wall time per training step (generation + step + sync), from step ``skip`` on."""

    def __init__(self, skip: int):
        self.skip, self.times, self._last = skip, [], None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self._last is not None and batch_idx >= self.skip:
            self.times.append(now - self._last)
        self._last = now


def step_time(mode: str, steps: int, skip: int, engine=None) -> dict:
    cfg = TrainConfig()
    cfg.logger.kind = "none"
    cfg.trainer.max_steps = steps
    cfg.trainer.output_dir = "/tmp/grpo-bench"
    cfg.rollout.engine = "vllm"
    cfg.rollout.mode = mode
    run = build_run(cfg, engine=engine)
    timer = StepTimer(skip)
    trainer = run.trainer(cfg, callbacks=run.callbacks + [timer], enable_progress_bar=False)
    trainer.fit(run.module, datamodule=run.datamodule)
    return {"seconds_per_step": statistics.median(timer.times), "engine": run.rollout.engine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2, help="sync/async training runs, alternated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="where the HF policy runs (cpu or cuda)")
    parser.add_argument(
        "--out-of-process",
        action="store_true",
        help="run vLLM's engine core in its own process (weights synced through a safetensors folder)",
    )
    parser.add_argument(
        "--server", action="store_true", help="also measure a launched vLLM server (the engine shared by DDP ranks)"
    )
    parser.add_argument("--model", default="tiny", help="model.name_or_path: tiny, smollm2_135m or a local folder")
    parser.add_argument(
        "--decoders", nargs="+", default=["fused", "loop", "generate"], help="HF engine decoders to measure"
    )
    parser.add_argument("--no-train", action="store_true", help="skip the sync vs async step-time runs")
    parser.add_argument(
        "--no-vllm",
        action="store_true",
        help="the HF decoders only: no in-process vLLM engine, so no vLLM sync and no training runs (they use it)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    policy, tokenizer = load_policy(ModelConfig(name_or_path=args.model))
    policy = policy.to(args.device).eval()
    max_len = 128 if args.model == "tiny" else 512
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=args.tokens, temperature=1.0))
    results: dict[str, float] = {}

    engines: dict = {
        f"hf_{decoder}": HFEngine(
            policy,
            tokenizer.pad_token_id,
            tokenizer.eos_token_id,
            batch_size=args.prompts * args.samples,
            decoder=decoder,
        )
        for decoder in args.decoders
    }
    if not args.no_vllm:
        start = time.perf_counter()
        engine = VLLMEngine.from_policy(
            policy, tokenizer, VLLMConfig(max_model_len=max_len, in_process=not args.out_of_process), seed=0
        )
        results["vllm_start_seconds"] = time.perf_counter() - start
        engines["vllm"] = engine
    if args.server:
        start = time.perf_counter()
        engines["server"] = VLLMServerEngine.from_policy(
            policy,
            tokenizer,
            VLLMConfig(max_model_len=max_len, server=VLLMServerConfig(launch=True, timeout_s=600)),
            seed=0,
        )
        results["server_start_seconds"] = time.perf_counter() - start
    measured = throughput(engines, tokenizer, sampling, args.repeats, args.prompts, args.samples)
    for name, r in measured.items():
        results[f"{name}_tokens_per_s"], results[f"{name}_batch_seconds"] = r["tokens_per_s"], r["batch_seconds"]
    if not args.no_vllm:
        syncs = [engine.load_weights(policy.state_dict().items()) for _ in range(5)]
        results["vllm_sync_seconds"] = statistics.median(syncs)
    if args.server:
        syncs = [engines["server"].load_weights(policy.state_dict().items(), version=v) for v in range(5)]
        results["server_sync_seconds"] = statistics.median(syncs)

    if not (args.no_train or args.no_vllm):
        # Alternate the modes (sync, async, sync, async, ...) so load changes hit both alike.
        per_step = {"sync": [], "async": []}
        for _ in range(args.rounds):
            for mode in per_step:
                per_step[mode].append(step_time(mode, args.steps, args.skip, engine=engine)["seconds_per_step"])
        results["train_sync_seconds_per_step"] = statistics.median(per_step["sync"])
        results["train_async_seconds_per_step"] = statistics.median(per_step["async"])
        results["async_speedup"] = results["train_sync_seconds_per_step"] / results["train_async_seconds_per_step"]

    if args.server:
        engines["server"].close()
    width = max(len(k) for k in results)
    print(
        f"\nrollout: {args.prompts} prompts x {args.samples} samples x {args.tokens} tokens, "
        f"torch threads {args.threads}, device {args.device}, "
        f"model {args.model}, vLLM {'not run' if args.no_vllm else 'out of process' if args.out_of_process else 'in process'}"
        f"{' and a launched server' if args.server else ''}"
    )
    for key, value in results.items():
        print(f"{key:<{width}}  {value:10.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
