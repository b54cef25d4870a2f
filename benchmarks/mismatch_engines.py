"""The engine-trainer mismatch each engine gives: HF vs in-process vLLM, float32 vs bfloat16, top-p 1.0 vs 0.9.

Every engine samples the same prompts (arithmetic, seeded); the trainer then scores the sampled
tokens as its first pass of a step does (float32 policy, the sampling temperature, micro-batches
of the batch, :func:`grpo_lightning.step.micro_batches.frozen_log_probs`), and
``algorithm/mismatch.py`` compares the two. Printed per engine and setting: k3, mean |delta logp|,
signed k1 and the mean IS weight. With top-p < 1 the engine reports the log-probs of the truncated
distribution and the trainer scores the full one: the gap is the truncation bias (log of the kept
mass), not noise.

    python benchmarks/mismatch_engines.py --model tiny
    python benchmarks/mismatch_engines.py --model smollm2_135m --prompts 4 --generations 4 --tokens 32
"""

from __future__ import annotations

import argparse
import copy
import json
from functools import partial

import torch

from grpo_lightning.algorithm.mismatch import mismatch_metrics, mismatch_sums
from grpo_lightning.algorithm.truncation import Truncation
from grpo_lightning.config import AlgorithmConfig, ModelConfig, RolloutConfig, VLLMConfig
from grpo_lightning.models import load_policy
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import HFEngine, RolloutGenerator, Sampling
from grpo_lightning.rollout.vllm import VLLMEngine
from grpo_lightning.step.micro_batches import frozen_log_probs, micro_batches
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.tasks.arithmetic import arithmetic_records


def measure(engine, policy, tokenizer, records, args, top_p: float) -> list[dict[str, float]]:
    """One row without the trainer replaying the engine's top-p filter, and (top-p < 1) one with it."""
    sampling = Sampling.from_config(
        RolloutConfig(max_new_tokens=args.tokens, temperature=args.temperature, top_p=top_p, top_k=0)
    )
    generator = RolloutGenerator(
        engine=engine,
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names({"arithmetic_exact": 1.0}),
        num_generations=args.generations,
        sampling=sampling,
        seed=0,
    )
    rollout = generator.generate(records, step=0, rank=0)
    module = GRPOModule(policy, AlgorithmConfig(beta=0.0))
    rows = []
    for replay in (False, True) if top_p < 1.0 else (False,):
        score = partial(module.completion_log_probs, truncation=Truncation(0, top_p) if replay else None)
        trainer = frozen_log_probs(score, policy, rollout, list(micro_batches(rollout, 8)))
        mask = rollout.completion_mask.bool() & trainer.finite
        m = mismatch_metrics(mismatch_sums(trainer.logp, rollout.engine_logprobs, mask))
        keys = ("k3", "abs_logp_diff_mean", "k1", "is_weight_mean", "tokens")
        rows.append({"replay": replay, **{k: round(m[f"mismatch/{k}"], 6) for k in keys}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--engines", default="hf,hf_bf16,vllm,vllm_bf16")
    args = parser.parse_args()
    torch.manual_seed(0)
    policy, tokenizer = load_policy(ModelConfig(name_or_path=args.model))
    policy.eval()
    records = arithmetic_records(9)[0][: args.prompts]
    for name in args.engines.split(","):
        if name.startswith("hf"):
            model = copy.deepcopy(policy).to(torch.bfloat16) if name.endswith("bf16") else policy
            engine = HFEngine(model, tokenizer.pad_token_id, tokenizer.eos_token_id)
        else:
            dtype = "bfloat16" if name.endswith("bf16") else "float32"
            config = VLLMConfig(dtype=dtype, kv_cache_gib=0.5)  # max_model_len: the model's own
            engine = VLLMEngine.from_policy(policy, tokenizer, config, seed=0)
        try:
            for top_p in (1.0, 0.9):
                for row in measure(engine, policy, tokenizer, records, args, top_p):
                    print(json.dumps({"model": args.model, "engine": name, "top_p": top_p, **row}), flush=True)
        finally:
            engine.close()


if __name__ == "__main__":
    main()
