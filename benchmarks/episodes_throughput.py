"""Episodes per second with slow environments: concurrent episodes vs one at a time (issue 33, goal 4).

Every episode goes through the real runner (``environments/episode.py``: the asyncio loop, the
turn batcher, the HF engine on the tiny in-code policy) and plays ``--turns`` model turns; after
each turn the environment takes ``--env-ms`` milliseconds in one of four ways:

- ``wait_async``: ``await asyncio.sleep`` (an environment waiting on I/O, written async);
- ``wait_sync``: ``time.sleep`` in a plain ``def step`` (the same, written synchronously: it runs
  in the runner's thread pool);
- ``cpu``: a pure-Python loop calibrated to take ``--env-ms`` alone (it holds the GIL, so threads
  cannot overlap it with each other, and it slows the engine's Python while it runs);
- ``none``: no environment time (generation alone, for reference).

``--episodes`` episodes are played in batches of ``c`` concurrent episodes for each ``c`` in
``--concurrency``; ``c = 1`` is the serial baseline (one episode at a time: generation and
environment strictly alternate). Rounds interleave every (environment, c) pair so machine load
hits all alike; the median of ``--rounds`` is reported, with the speed-up over serial and the
share of the environment's time hidden behind generation and other episodes, against what the
environment adds when episodes run one at a time (measured, so machine load counts alike):
``1 - (T(kind, c) - T(none, c)) / (T(kind, 1) - T(none, 1))`` (1: fully hidden; 0: not at all).

Usage: ``python benchmarks/episodes_throughput.py [--episodes 8] [--turns 4] [--env-ms 50]
[--rounds 3] [--threads 1]``; prints a table and writes JSON to ``--out`` when given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch

from grpo_lightning.config import ModelConfig
from grpo_lightning.environments.base import Reset, Step, Turn
from grpo_lightning.environments.episode import EpisodeRunner
from grpo_lightning.environments.limits import DONE, EpisodeLimits
from grpo_lightning.environments.render import ChatRenderer
from grpo_lightning.models import load_policy
from grpo_lightning.rollout import HFEngine, Sampling

KINDS = ("none", "wait_async", "wait_sync", "cpu")


def burn(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def calibrate(seconds: float) -> int:
    """Iterations of :func:`burn` that take ``seconds`` of this thread's CPU time (not wall time: on a
    loaded machine the wall clock would under-count the work)."""
    n = 20_000
    while True:
        start = time.thread_time()
        burn(n)
        took = time.thread_time() - start
        if took > 0.02:
            return max(1, int(n * seconds / took))
        n *= 2


class SlowEnv:
    """Answers every turn with the same short message after ``seconds`` spent the way ``kind`` says; done
    after ``turns`` turns."""

    def __init__(self, kind: str, seconds: float, turns: int, iterations: int):
        self.kind, self.seconds, self.turns, self.iterations = kind, seconds, turns, iterations
        self.count = 0

    def reset(self, seed: int, row: dict) -> Reset:
        return Reset(messages=[{"role": "user", "content": row["prompt"]}])

    def _reply(self) -> Step:
        self.count += 1
        return Step(messages=[{"role": "user", "content": " go on."}], reward=1.0, done=self.count >= self.turns)

    def step(self, turn: Turn) -> Step:
        if self.kind == "wait_sync":
            time.sleep(self.seconds)
        elif self.kind == "cpu":
            burn(self.iterations)
        return self._reply()

    def close(self) -> None:
        pass


class AsyncSlowEnv(SlowEnv):
    async def step(self, turn: Turn) -> Step:
        await asyncio.sleep(self.seconds)
        return self._reply()


def play(runner_for, kind: str, episodes: int, concurrency: int, round_: int) -> tuple[float, int]:
    """Seconds to play ``episodes`` episodes, ``concurrency`` at a time, and the turns played."""
    runner = runner_for(kind)
    turns, start = 0, time.perf_counter()
    for first in range(0, episodes, concurrency):
        n = min(concurrency, episodes - first)
        rows = [{"prompt": f"{first + i}+{round_}="} for i in range(n)]
        seeds = [1000 * round_ + first + i for i in range(n)]
        played = runner.run(rows, seeds, seeds)
        assert all(e.stop_reason == DONE for e in played), [e.stop_reason for e in played]
        turns += sum(e.num_turns for e in played)
    return time.perf_counter() - start, turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--env-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    policy, tokenizer = load_policy(ModelConfig(name_or_path="tiny"))
    policy.eval()
    engine = HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id, batch_size=max(args.concurrency))
    renderer = ChatRenderer(tokenizer)
    limits = EpisodeLimits(max_turns=args.turns, max_turn_tokens=args.turn_tokens, context=4096)
    sampling = Sampling(max_new_tokens=args.turn_tokens, temperature=1.0, top_p=1.0, top_k=0)
    seconds = args.env_ms / 1000
    iterations = calibrate(seconds)

    def runner_for(kind: str) -> EpisodeRunner:
        cls = AsyncSlowEnv if kind == "wait_async" else SlowEnv
        env_seconds = 0.0 if kind == "none" else seconds
        return EpisodeRunner(
            engine, renderer, lambda row: cls(kind, env_seconds, args.turns, iterations), limits, sampling
        )

    play(runner_for, "none", max(args.concurrency), max(args.concurrency), round_=99)  # warm-up
    times: dict[tuple[str, int], list[float]] = {(k, c): [] for k in args.kinds for c in args.concurrency}
    turns: dict[tuple[str, int], int] = {}
    for round_ in range(args.rounds):
        for kind in args.kinds:
            for c in args.concurrency:
                took, turns[kind, c] = play(runner_for, kind, args.episodes, c, round_)
                times[kind, c].append(took)

    results: dict[str, dict] = {}
    print(
        f"{args.episodes} episodes x {args.turns} turns x {args.turn_tokens} tokens/turn, env {args.env_ms:.0f} ms/step"
    )
    env_total = args.episodes * args.turns * seconds
    print(f"{'environment':<12} {'concurrent':>10} {'episodes/s':>11} {'vs serial':>10} {'seconds':>8} {'hidden':>7}")
    for kind in args.kinds:
        serial = statistics.median(times[kind, min(args.concurrency)])
        for c in args.concurrency:
            median = statistics.median(times[kind, c])
            row = {"episodes_per_s": args.episodes / median, "speedup": serial / median, "seconds": median}
            if kind != "none" and "none" in args.kinds:
                alone = serial - statistics.median(times["none", min(args.concurrency)])
                row["hidden"] = 1 - (median - statistics.median(times["none", c])) / alone
            results[f"{kind}@{c}"] = row
            hidden = f"{row['hidden']:>7.0%}" if "hidden" in row else f"{'':>7}"
            print(f"{kind:<12} {c:>10} {row['episodes_per_s']:>11.2f} {row['speedup']:>9.2f}x {median:>8.2f} {hidden}")
    print(f"environment time as written, one episode at a time: {env_total:.2f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
