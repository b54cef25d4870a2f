"""Does the tiny in-code policy learn task=guess_number (a multi-turn higher/lower game) on a CPU?

For each seed, one run of the CLI (``grpo-lightning task=guess_number ...``) that plays the held-out
games before training and every ``--eval-every`` steps (``val/*``, sampled at temperature 1, 16
episodes a game with fixed seeds: every evaluation plays the same games); its ``summary.json``
gives before and after. Next to it a random player (a uniform guess every turn) and the optimal
one (binary search) play the same held-out games with the same reset seeds.

    python examples/guess_number.py                      # 2 seeds, 200 steps
    python examples/guess_number.py --steps 40 --seeds 0
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

from grpo_lightning.environments.base import Turn
from grpo_lightning.evaluation.episodes import row_seed
from grpo_lightning.tasks.base import task_records
from grpo_lightning.tasks.guess_number import GuessNumberEnv, GuessNumberTaskConfig

SAMPLES = 16  # episodes per held-out game (eval.samples_per_row)


def command(seed: int, steps: int, lr: float, group: int, every: int, out: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "grpo_lightning.train", "task=guess_number", "logger=csv"),
        f"trainer.max_steps={steps}",
        f"trainer.seed={seed}",
        f"trainer.output_dir={out}",
        f"hydra.run.dir={out}",
        "algorithm.beta=0",
        f"algorithm.lr={lr}",
        "rollout.max_new_tokens=3",
        f"rollout.num_generations={group}",
        f"rollout.prompts_per_step={128 // group}",
        "eval.greedy=false",
        f"eval.samples_per_row={SAMPLES}",
        f"eval.every_n_steps={every}",
    ]


def play_scripted(strategy: str, games: list[dict], options: GuessNumberTaskConfig) -> dict[str, float]:
    """Each held-out game with its evaluation's reset seed, ``SAMPLES`` times (random: seeded like the policy's episodes)."""
    rewards, solved, turns = [], [], []
    for game in games:
        for sample in range(SAMPLES):
            rng = random.Random(row_seed(game, sample))
            env = GuessNumberEnv(options.max_number, options.turn_cost)
            env.reset(seed=row_seed(game, -1), row=game)
            low, high, reward, done, n = 1, options.max_number, 0.0, False, 0
            while not done and n < options.max_turns:
                guess = rng.randint(1, options.max_number) if strategy == "random" else (low + high) // 2
                step = env.step(Turn(text=str(guess), token_ids=[]))
                n, done, reward = n + 1, step.done, reward + (step.reward or 0.0)
                low, high = (guess + 1, high) if step.messages[0]["content"] == "+" else (low, guess - 1)
            rewards.append(reward), solved.append(done), turns.append(n)
    return {
        "val/reward": sum(rewards) / len(rewards),
        "val/success": sum(solved) / len(solved),
        "val/turns": sum(turns) / len(turns),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--group", type=int, default=16, help="Episodes per game (G); 128 per step in all.")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--out", default="outputs/guess_number")
    args = parser.parse_args()
    options = GuessNumberTaskConfig()
    games = task_records(options)[1]
    rows = [(name, "-", play_scripted(name, games, options)) for name in ("random", "optimal")]
    for seed in args.seeds:
        out = Path(args.out) / f"seed{seed}"
        subprocess.run(command(seed, args.steps, args.lr, args.group, args.eval_every, out), check=True)
        summary = json.loads((out / "summary.json").read_text())
        held_out = summary["held_out"]
        rows.append((f"tiny, seed {seed}, before", "-", held_out["before"]))
        rows.append(
            (
                f"tiny, seed {seed}, after {summary['steps']} steps",
                f"{summary['wall_seconds']:.0f} s",
                held_out["after"],
            )
        )
    print(f"\n{len(games)} held-out games x {SAMPLES} episodes each\n")
    print("| policy | training | val/reward | val/success | val/turns |\n|---|---|---|---|---|")
    for name, seconds, m in rows:
        print(f"| {name} | {seconds} | {m['val/reward']:.3f} | {m['val/success']:.0%} | {m['val/turns']:.2f} |")


if __name__ == "__main__":
    main()
