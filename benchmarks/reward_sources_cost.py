"""Cost per completion of each reward source on this machine (CPU), as JSON.

- reward_model: SmolLM2-135M loaded as a sequence classifier (a 135M reward model's cost; its
  score head is untrained), 16 completions of about 100 tokens per call, float32 and bfloat16.
- code_tests: 16 completions with 3 assert tests each (48 sandboxed runs), ``workers`` at once.
- judge: the client's own cost against a loopback server that answers at once (the judge
  model's time is the server's: examples/judge_smollm2.py measures SmolLM2 served by vLLM).

    python benchmarks/reward_sources_cost.py [--sources reward_model code_tests judge]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from grpo_lightning.models.smollm2 import ensure_smollm2
from grpo_lightning.rewards.sources.code_sandbox import CodeTestsOptions, CodeTestsReward
from grpo_lightning.rewards.sources.judge import JudgeOptions, JudgeReward
from grpo_lightning.rewards.sources.reward_model import RewardModelOptions, RewardModelReward

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers.scripted_judge import ScriptedJudge  # noqa: E402

N = 16


def per_completion(fn, repeats: int = 3) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats / N


def reward_model_cost(dtype: str) -> float:
    folder = ensure_smollm2()
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1)
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(folder).save_pretrained(tmp)
        reward = RewardModelReward(RewardModelOptions(path=tmp, dtype=dtype, device="cpu"))
    prompts = ["Natalia sold clips to 48 of her friends in April, and then half as many in May. How many?"] * N
    completions = ["She sold 48 in April and 24 in May, so 48 + 24 = 72 clips in total. <answer>72</answer>" * 2] * N
    return per_completion(lambda: reward(prompts=prompts, completions=completions))


def code_tests_cost() -> float:
    reward = CodeTestsReward(CodeTestsOptions(workers=4))
    code = "```python\ndef add_k(x):\n    return x + 3\n```"
    tests = [["assert add_k(0) == 3", "assert add_k(5) == 8", "assert add_k(-3) == 0"]] * N
    return per_completion(lambda: reward(prompts=["p"] * N, completions=[code] * N, tests=tests), repeats=1)


def judge_cost() -> tuple[float, float]:
    with ScriptedJudge(lambda text, headers: (200, "Score: 7")) as server:
        reward = JudgeReward(JudgeOptions(url=server.url, model="m", concurrency=8))
        counter = iter(range(10**9))
        uncached = per_completion(
            lambda: reward(prompts=[f"p{next(counter)}" for _ in range(N)], completions=["c"] * N)
        )
        cached = per_completion(lambda: reward(prompts=["same"] * N, completions=["c"] * N))
    return uncached, cached


SOURCES = ("reward_model", "code_tests", "judge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sources", nargs="+", choices=SOURCES, default=list(SOURCES), help="the reward sources to measure"
    )
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    seconds: dict[str, float] = {}
    if "judge" in args.sources:  # first: the loopback server before any model loads
        uncached, cached = judge_cost()
        seconds["judge_client_uncached_loopback"], seconds["judge_client_cached"] = round(uncached, 5), round(cached, 6)
    if "reward_model" in args.sources:
        seconds["reward_model_smollm2_float32"] = round(reward_model_cost("float32"), 4)
        seconds["reward_model_smollm2_bfloat16"] = round(reward_model_cost("bfloat16"), 4)
    if "code_tests" in args.sources:
        seconds["code_tests_3_asserts"] = round(code_tests_cost(), 4)
    result = {"threads": torch.get_num_threads(), "completions_per_call": N, "seconds_per_completion": seconds}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
