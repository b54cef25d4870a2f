"""Does the tiny in-code policy learn task=guess_number (a multi-turn higher/lower game) on a CPU?

For each seed: play held-out games with the untrained policy, train with GRPO on episodes,
play again; next to a random policy (a uniform guess every turn) and the optimal one (binary
search), played on the same environment. Reports mean reward, solve rate and mean turns to solve.

    python examples/guess_number.py            # 2 seeds, the default steps
    python examples/guess_number.py --steps 40 --seeds 0
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import warnings

from grpo_lightning.build import build_run
from grpo_lightning.config import TrainConfig
from grpo_lightning.environments.base import Turn
from grpo_lightning.tasks.guess_number import GuessNumberEnv, GuessNumberTaskConfig

EVAL_PROMPTS = 32  # x num_generations games per evaluation


def config(seed: int, steps: int, lr: float, group: int) -> TrainConfig:
    cfg = TrainConfig()
    cfg.task = GuessNumberTaskConfig()
    cfg.trainer.max_steps, cfg.trainer.seed = steps, seed
    cfg.logger.kind = "none"
    cfg.health.enabled = False
    cfg.algorithm.beta, cfg.algorithm.lr = 0.0, lr
    cfg.rollout.max_new_tokens, cfg.rollout.num_generations, cfg.rollout.prompts_per_step = 3, group, 128 // group
    cfg.trainer.output_dir = f"outputs/guess_number_seed{seed}"
    return cfg


def summary(rewards: list[float], solved: list[bool], turns: list[int]) -> dict[str, float]:
    solved_turns = [t for t, s in zip(turns, solved, strict=True) if s]
    return {
        "reward": statistics.fmean(rewards),
        "solved": statistics.fmean(solved),
        "turns_to_solve": statistics.fmean(solved_turns) if solved_turns else float("nan"),
    }


def play_policy(run, step: int) -> dict[str, float]:
    """Held-out games (reset seeds of a step far from training's) with the policy sampling at temperature 1."""
    generator = run.module.rollout
    records = [{"prompt": "1-8?", "game": i} for i in range(EVAL_PROMPTS)]
    episodes = generator.episodes.play(generator, records, step=step, rank=0)
    rewards = [generator.episodes.env_reward(e) for e in episodes]
    return summary(rewards, [bool(e.info.get("solved")) for e in episodes], [e.num_turns for e in episodes])


def play_scripted(strategy: str, games: int, max_turns: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    rewards, solved, turns = [], [], []
    for _ in range(games):
        env = GuessNumberEnv()
        env.reset(seed=rng.randrange(2**62), row={})
        low, high, reward, done, n = 1, env.max_number, 0.0, False, 0
        while not done and n < max_turns:
            guess = rng.randint(1, env.max_number) if strategy == "random" else (low + high) // 2
            step = env.step(Turn(text=str(guess), token_ids=[]))
            n, done, reward = n + 1, step.done, reward + (step.reward or 0.0)
            low, high = (guess + 1, high) if step.messages[0]["content"] == "+" else (low, guess - 1)
        rewards.append(reward), solved.append(done), turns.append(n)
    return summary(rewards, solved, turns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--group", type=int, default=16, help="Episodes per game (G); 128 per step in all.")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    max_turns = GuessNumberTaskConfig().max_turns
    for name in ("random", "optimal"):
        rows.append((name, "-", play_scripted(name, EVAL_PROMPTS * 8, max_turns, seed=0)))
    for seed in args.seeds:
        cfg = config(seed, args.steps, args.lr, args.group)
        run = build_run(cfg)
        run.module.rollout.setup(run.module.policy)
        before = play_policy(run, step=10**6)
        start = time.perf_counter()
        trainer = run.trainer(cfg, enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(run.module, datamodule=run.datamodule)
        seconds = time.perf_counter() - start
        after = play_policy(run, step=10**6)
        rows.append((f"tiny seed {seed}, before", "-", before))
        rows.append((f"tiny seed {seed}, after {args.steps} steps", f"{seconds:.0f} s", after))
        if run.lock is not None:
            run.lock.release()
    print("\n| policy | training | mean reward | solved | turns to solve |\n|---|---|---|---|---|")
    for name, seconds, m in rows:
        print(f"| {name} | {seconds} | {m['reward']:.3f} | {m['solved']:.0%} | {m['turns_to_solve']:.2f} |")


if __name__ == "__main__":
    main()
