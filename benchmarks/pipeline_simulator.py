"""The pipeline at scale, simulated: an engine stand-in with a decode-step time and a long-tailed
completion-length distribution drives the real producer and trainer loop (issue 50, docs/pipeline.md).

The stand-in (:class:`SimEngine`, a :class:`~grpo_lightning.rollout.pipeline.engine.StreamingEngine`)
decodes every sequence in flight one token per step of ``--step-ms`` milliseconds, as a GPU engine
does at batch sizes below its capacity; ``E`` engines are ``E`` times its rows (``--rows`` each).
Completion lengths are log-normal (``--median-tokens``, ``--sigma``) capped at ``--max-tokens``:
most short, a tail at the cap, as in reasoning. A weight sync pauses it ``--sync-ms`` between two
steps. The trainer is the real :class:`PipelineRolloutGenerator` loop: each step takes the next
finished groups, "trains" for ``--train-ms-per-sample`` x samples / R milliseconds (R data-parallel
ranks), and pushes new weights. ``max_lag=0`` is the synchronous schedule (the step's groups only,
the engine idle while the trainer trains); the ratio of each lag to it is the pipeline's gain.

It reports, per (engines, ranks, lag), samples per second, the ratio to lag 0, the engine's busy
fraction (some sequence decoding), its rows' utilisation (the E engines' rows in use, on average)
and the trainer's busy fraction, measured by the same clocks as a real run (``pipeline/*``). ``--contention
c``: while both run, a decode step and a training step each take ``c`` times longer (engine and trainer
on the same cores, as on a CPU; 1 for separate devices). Real time,
scaled down: a run lasts about ``--steps`` x a step, so keep the milliseconds small. ``--measured
FILE`` (``pipeline_throughput.py``'s JSON) first takes this machine's rates from a measured run
(the seconds per decode step and per trained sample, the completion lengths) and compares the
simulated ratios with the measured ones, with and without the contention measured there (the
trainer's busy seconds beside the engine over its busy seconds in sync mode). Usage: ``python benchmarks/pipeline_simulator.py
[--engines 1 4 16 64] [--ranks 1 8] [--lags 0 1 2] [--steps 12] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import threading
import time

from grpo_lightning.config import RolloutConfig
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.records import PolicyWeights
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import Sampling
from grpo_lightning.rollout.pipeline import PipelineRolloutGenerator, PromptStream
from tests.helpers.scripted_pipeline import TickingEngine


class SimEngine(TickingEngine):
    """Decodes every sequence in flight one token per ``step_s``; ``rows`` sequences at most."""

    finished_flag = True

    def __init__(self, step_s: float, rows: int, lengths, sync_s: float, contention: float = 1.0):
        self.step_s, self.lengths, self.sync_s = step_s, lengths, sync_s
        self.contention = contention  # a decode step takes this many times longer while the trainer trains
        self.training = threading.Event()  # set by the trainer while it trains (shared cores: both slow down)
        self.row_seconds = 0.0  # sequences decoding x seconds: the rows' utilisation is this over rows x wall
        self._next = time.perf_counter()  # the next tick's time: a fixed cadence, whatever Python took
        super().__init__(rows, name="sim-engine")

    def length(self, request, sampling) -> int:
        return self.lengths(request.seed)

    def apply(self, weights, version) -> None:
        time.sleep(self.sync_s)
        self.version = version

    def emit(self, seq: dict) -> None:
        seq["tokens"].append(3)
        seq["logp"].append(0.0)
        seq["v"].append(self.version)

    def pause(self) -> None:
        slow = self.contention if self.training.is_set() else 1.0
        with self._cond:
            self.row_seconds += len(self._live) * self.step_s * slow
        now = time.perf_counter()
        if now - self._next > 10 * self.step_s:  # it was idle: the cadence starts again from now
            self._next = now
        self._next += self.step_s * slow  # behind (Python took longer): the next ticks catch up
        time.sleep(max(0.0, self._next - now))

    def sequence_logprobs(self, prompt_ids, completion_ids):
        return [0.0] * len(completion_ids)


def lognormal_lengths(median: float, sigma: float, cap: int, seed: int):
    """Seed -> a completion length: log-normal around ``median``, at most ``cap`` (the tail piles up there)."""

    def length(request_seed: int) -> int:
        draw = random.Random(seed * 1_000_003 + request_seed).lognormvariate(math.log(median), sigma)
        return max(1, min(cap, round(draw)))

    return length


RECORDS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(4096)]
TOKENIZER = build_char_tokenizer()


class IdentityOrder(list):
    def set_epoch(self, epoch: int) -> None:
        pass


def simulate(engines: int, ranks: int, lag: int, args, seed: int = 0) -> dict[str, float]:
    P, G = args.prompts, args.generations
    lengths = lognormal_lengths(args.median_tokens, args.sigma, args.max_tokens, seed)
    engine = SimEngine(args.step_ms / 1000, args.rows * engines, lengths, args.sync_ms / 1000, args.contention)
    generator = PipelineRolloutGenerator(
        engine=engine,
        tokenizer=TOKENIZER,
        scorer=RewardScorer.from_names({"length_penalty": 1.0}),
        num_generations=G,
        sampling=Sampling.from_config(RolloutConfig(max_new_tokens=args.max_tokens)),
        seed=seed,
        max_lag=lag,
        max_off_policy_steps=99,
    )
    generator.streams = lambda rank, world: PromptStream(RECORDS, lambda: IdentityOrder(range(len(RECORDS))), P)
    generator.budget_batches = args.steps
    generator.sync_weights(PolicyWeights([], 0))
    train_s = args.train_ms_per_sample / 1000 * P * G / ranks
    start, trained = time.perf_counter(), 0
    waits, engine_busy = [], []
    try:
        for step in range(args.steps):
            generator.trainer_version = step
            batch = generator.rollout_for_step(None, step=step, rank=0)
            trained += batch.num_sequences
            waits.append(batch.timing["pipeline/trainer_wait_seconds"])
            engine_busy.append(batch.timing["pipeline/engine_busy_seconds"])
            engine.training.set()
            busy = bool(engine._live or engine._waiting)  # the engine decodes meanwhile: shared cores slow both
            time.sleep(train_s * (args.contention if busy else 1.0))  # the optimizer step on R ranks
            engine.training.clear()
            generator.sync_weights(PolicyWeights([], step + 1))
        wall = time.perf_counter() - start
        lag_mean = batch.timing["pipeline/lag_mean"]
    finally:
        generator.close()
        engine.close()
    return {
        "samples_per_s": trained / wall,
        "engine_busy_fraction": sum(engine_busy) / wall,  # some sequence decoding
        "row_utilisation": engine.row_seconds / (engine.rows * wall),  # the E engines' rows, on average
        "trainer_busy_fraction": 1 - sum(waits) / wall,
        "lag_mean_last": lag_mean,
    }


def rates_from(measured_file: str, args) -> dict:
    """This machine's rates from a pipeline_throughput.py run: its sync run's decode-step and training
    seconds, its completion lengths; and the measured ratios to compare with."""
    data = json.load(open(measured_file))
    sync, a = data["median"]["sync"], data["args"]
    steps, samples = a["steps"], a["prompts"] * a["generations"]
    return {
        # a sync step decodes until its longest completion: about max_new_tokens decode steps
        "step_ms": 1000 * sync["engine_busy_s"] / (steps * a["max_new_tokens"]),
        "train_ms_per_sample": 1000 * sync["trainer_busy_s"] / (steps * samples),
        "median_tokens": sync["mean_length"] * 0.7,
        "max_tokens": a["max_new_tokens"],
        "prompts": a["prompts"],
        "generations": a["generations"],
        "measured": {k: v.get("vs_sync_round_median", v.get("vs_sync")) for k, v in data["median"].items()},
        # how much slower the trainer ran beside the engine (both on the same cores) than alone, in sync mode
        "contention": statistics.mean(
            data["median"][f"pipeline{lag}"]["trainer_busy_s"] / sync["trainer_busy_s"]
            for lag in a["max_lags"]
            if f"pipeline{lag}" in data["median"]
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--lags", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--rows", type=int, default=64, help="sequences one engine decodes at once")
    parser.add_argument("--step-ms", type=float, default=2.0, help="one decode step of one engine")
    parser.add_argument("--train-ms-per-sample", type=float, default=1.0, help="on one rank")
    parser.add_argument("--sync-ms", type=float, default=2.0)
    parser.add_argument("--median-tokens", type=float, default=24)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--contention", type=float, default=1.0, help="slow-down of each side while both run (1: separate devices)"
    )
    parser.add_argument("--measured", default=None, help="pipeline_throughput.py's JSON: take its rates first")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out: dict = {"args": vars(args).copy(), "grid": []}
    if args.measured:
        rates = rates_from(args.measured, args)
        machine = argparse.Namespace(
            **{**vars(args), **{k: v for k, v in rates.items() if k not in ("measured", "contention")}}
        )
        machine.rows = 256
        out["this_machine"] = {"rates": rates}
        print(f"this machine's rates {json.dumps({k: v for k, v in rates.items() if k != 'measured'})}")
        for name, contention in (("separate devices", 1.0), ("shared cores", rates["contention"])):
            machine.contention = contention
            simulated = {lag: simulate(1, 1, lag, machine) for lag in (0, 1, 2)}
            ratios = {lag: r["samples_per_s"] / simulated[0]["samples_per_s"] for lag, r in simulated.items()}
            out["this_machine"][f"simulated_vs_lag0, {name}"] = ratios
            for lag in (1, 2):
                print(
                    f"  lag {lag}, {name} (contention {contention:.2f}): simulated {ratios[lag]:.2f}x sync, "
                    f"measured {rates['measured'].get(f'pipeline{lag}', float('nan')):.2f}x"
                )
    print(
        f"{'engines':>7} {'ranks':>5} {'lag':>3} {'samples/s':>9} {'vs lag0':>7} {'engine busy':>11} {'trainer busy':>12}"
    )
    for engines in args.engines:
        for ranks in args.ranks:
            base = None
            for lag in args.lags:
                r = simulate(engines, ranks, lag, args)
                base = base or r["samples_per_s"]
                r.update(engines=engines, ranks=ranks, lag=lag, vs_lag0=r["samples_per_s"] / base)
                out["grid"].append(r)
                print(
                    f"{engines:7d} {ranks:5d} {lag:3d} {r['samples_per_s']:9.1f} {r['vs_lag0']:7.2f} "
                    f"{r['engine_busy_fraction']:11.2f} {r['row_utilisation']:9.2f} {r['trainer_busy_fraction']:12.2f}"
                )
    best = max((r["vs_lag0"] for r in out["grid"]), default=float("nan"))
    print("RESULT " + json.dumps({"best_vs_lag0": best, "runs": len(out["grid"])}))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
