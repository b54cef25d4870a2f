"""The model-compute floor of one GRPO step run the plain way: what a trainer that feeds this
HF model padded rows must spend (TRL does).

On a setting of ``trl_vs_ours.py`` (its prompts, batch, completion length, beta 0.04,
gradient checkpointing on, one thread) this times only the Hugging Face model's own work,
with no trainer around it:

1. decode: a bare KV-cache loop (prefill, then one token per forward, stopping when every
   sequence has ended), sampling with our per-sample seeded sampler;
2. reference: one forward without gradient over prompt + completion (the KL term);
3. train: one forward with gradient (checkpointed) plus the backward;
4. optimizer: gradient clipping and one AdamW step.

The sum is a floor for the whole step of a trainer that runs these padded passes and this
decode loop; ours goes below it by doing less work (packed rows without padding, the output
head on completion positions only, the fused decoder), so "ours above the floor" can be
negative. Read next to the identical-settings table of the latest
``benchmarks/results/trl_vs_ours_<setting>.json`` it says how far below TRL's step a trainer
can go by trimming overhead alone: when the floor is above half of TRL's step, a target of
"half of TRL's step" needs less work, not less overhead.

    python benchmarks/step_floor.py --setting tiny [--repeats 30]
    python benchmarks/step_floor.py --setting smollm2 --model-dir DIR --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache
from trl_vs_ours import SETTINGS, prompt_records  # the same settings and prompts

from grpo_lightning.config import ModelConfig, RolloutConfig
from grpo_lightning.models import load_policy
from grpo_lightning.records import RolloutBatch
from grpo_lightning.rollout import Sampling
from grpo_lightning.rollout.sampler import SeededSampler
from grpo_lightning.rollout.seeding import group_seeds


@torch.no_grad()
def decode(
    model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, seeds: list[int], eos: int, pad: int, max_tokens: int
) -> torch.Tensor:
    """Prompt + sampled completion ids [B, P + C]: the least work an HF-model rollout needs."""
    sampler = SeededSampler(seeds, Sampling.from_config(RolloutConfig(max_new_tokens=max_tokens)))
    cache, mask = DynamicCache(), prompt_mask
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(
        input_ids=prompt_ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    ended = torch.zeros(len(seeds), dtype=torch.bool)
    tokens, position = [], positions[:, -1:]
    for _ in range(max_tokens):
        token, _ = sampler.draw(logits)
        token = torch.where(ended, pad, token)
        tokens.append(token)
        ended |= token == eos
        if bool(ended.all()):
            break
        mask, position = torch.cat([mask, torch.ones_like(mask[:, :1])], 1), position + 1
        logits = model(
            input_ids=token[:, None], attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True
        ).logits[:, -1]
    return torch.cat([prompt_ids, torch.stack(tokens, 1)], 1)


def completion_logp(model, ids: torch.Tensor, prompt_width: int) -> torch.Tensor:
    keep = ids.shape[1] - prompt_width + 1  # the completion's logits only, as both trainers do
    logits = model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[:, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[:, prompt_width:, None]).squeeze(-1)


def train_pass(policy, ids: torch.Tensor, prompt_width: int, weights: torch.Tensor) -> None:
    """One forward with gradient over prompt + completion, and the backward."""
    (completion_logp(policy, ids, prompt_width) * weights).mean().backward()


def optimizer_step(policy, optimizer) -> None:
    torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(fn, *args):
    """``fn(*args)`` and the seconds it took."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--model-dir", help="local SmolLM2-135M-Instruct folder (setting smollm2)")
    parser.add_argument("--repeats", type=int, default=30, help="steps timed after 2 warm-up steps")
    parser.add_argument(
        "--results",
        help="trl_vs_ours.py output to compare with "
        "(default benchmarks/results/trl_vs_ours_<setting>.json; skipped when missing)",
    )
    parser.add_argument("--out", help="where to write the floor (default benchmarks/results/step_floor_<setting>.json)")
    args = parser.parse_args()
    if args.setting == "smollm2" and not args.model_dir:
        parser.error("--setting smollm2 needs --model-dir (a local SmolLM2-135M-Instruct folder)")
    args.results = args.results or f"benchmarks/results/trl_vs_ours_{args.setting}.json"
    torch.set_num_threads(1)
    s = SETTINGS[args.setting]
    name = args.model_dir or "tiny"

    policy, tokenizer = load_policy(ModelConfig(name_or_path=name, gradient_checkpointing=True))
    reference, _ = load_policy(ModelConfig(name_or_path=name))
    reference.eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in prompt_records(s["prompts"])]
    prompt_ids, prompt_mask = RolloutBatch.pad_prompts(
        [p for p in prompts for _ in range(s["generations"])], tokenizer.pad_token_id
    )
    width = prompt_ids.shape[1]
    parts: dict[str, list[float]] = {"decode": [], "reference": [], "train": [], "optimizer": []}
    for step in range(args.repeats + 2):
        seeds = group_seeds(0, 0, step, s["prompts"], s["generations"])
        policy.eval()
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        ids, decode_s = timed(decode, policy, prompt_ids, prompt_mask, seeds, eos, pad, s["max_tokens"])
        times = {"decode": decode_s}
        policy.train()
        with torch.no_grad():
            times["reference"] = timed(completion_logp, reference, ids, width)[1]
        weights = torch.randn(ids.shape[0], 1)
        times["train"] = timed(train_pass, policy, ids, width, weights)[1]
        times["optimizer"] = timed(optimizer_step, policy, optimizer)[1]
        if step >= 2:  # warm-up steps left out
            for name, seconds in times.items():
                parts[name].append(seconds)
    floor = {name: statistics.median(values) for name, values in parts.items()}
    total = sum(floor.values())
    print(
        f"setting {args.setting}: {s['prompts']} prompts x {s['generations']} generations x {s['max_tokens']} "
        f"tokens, 1 thread, median of {args.repeats} steps"
    )
    for name, seconds in floor.items():
        print(f"  {name:<10} {1000 * seconds:7.1f} ms")
    print(f"  {'floor':<10} {1000 * total:7.1f} ms")
    result = {
        "setting": args.setting,
        "floor_ms": {k: 1000 * v for k, v in floor.items()},
        "floor_total_ms": 1000 * total,
    }
    if Path(args.results).exists():
        # The identical-settings table: checkpointing on and the model's own forward, as the floor.
        measured = json.loads(Path(args.results).read_text())["tables"]["identical"]["results"]
        ours, trl = measured["ours"]["median_step_s"], measured["trl"]["median_step_s"]
        print(f"from {args.results} (identical settings): ours {1000 * ours:.1f} ms, TRL {1000 * trl:.1f} ms per step")
        print(
            f"floor / TRL = {total / trl:.2f}   ours / TRL = {ours / trl:.2f}   "
            f"ours above the floor: {1000 * (ours - total):.1f} ms, TRL above it: {1000 * (trl - total):.1f} ms"
        )
        result.update({"ours_ms": 1000 * ours, "trl_ms": 1000 * trl, "floor_over_trl": total / trl})
    out = Path(args.out or f"benchmarks/results/step_floor_{args.setting}.json")
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
