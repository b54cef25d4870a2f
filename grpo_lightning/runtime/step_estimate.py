"""A start-up estimate of one step's time for an episode task on a CPU, said when it is minutes.

Why: a default that fits a GPU (128 episodes of a few hundred tokens) takes tens of minutes a step
on a laptop's cores, and nothing said so: the run looked hung. Two forward passes of the policy
are timed now, on this machine as loaded now: one over ``PROBE`` tokens (the cost of a token in
a long pass) and one over a single token (the fixed cost of a pass: a decoding step). A step is
then about

- generation: for every turn, the prefill of each episode's context and one decoding step per
  token of the turn budget, the episodes decoded together (each step costs the fixed cost plus a
  token per episode);
- training: ``passes`` token costs per token of every episode (forward and backward, the reference).

The environment's replies are not counted and episodes that end early cost less: an upper-ish
estimate, good to a factor of a few, enough to tell seconds from minutes.
"""

from __future__ import annotations

import time

import torch

PROBE = 128  # tokens of the timed long pass
PASSES = 4.0  # training cost per token in forward passes: forward + backward (~3) + the reference (1)
SAY_ABOVE_S = 60.0  # the estimate is said when a step would take longer


def time_forward(policy: torch.nn.Module, vocab: int) -> tuple[float, float]:
    """(seconds per token of a long pass, seconds of a one-token pass), the best of two of each."""
    ids = torch.randint(0, max(vocab, 2), (1, PROBE))
    was_training = policy.training
    policy.eval()
    times = {}
    try:
        with torch.no_grad():
            for length in (PROBE, 1):
                best = float("inf")
                for _ in range(2):
                    start = time.perf_counter()
                    policy(input_ids=ids[:, :length])
                    best = min(best, time.perf_counter() - start)
                times[length] = best
    finally:
        policy.train(was_training)
    return times[PROBE] / PROBE, times[1]


def episode_step_seconds(
    token_s: float, pass_s: float, episodes: int, prompt_tokens: int, turns: int, budget: int, passes: float = PASSES
) -> float:
    """The estimate of one step (see the module docstring)."""
    generation = 0.0
    for turn in range(turns):
        context = prompt_tokens + turn * budget
        generation += episodes * context * token_s + budget * (pass_s + episodes * token_s)
    length = prompt_tokens + turns * budget
    return generation + passes * episodes * length * token_s


def estimate_line(seconds: float, episodes: int, prompt_tokens: int, turns: int, budget: int) -> str | None:
    """The start-up line when a step would take minutes, naming what sets its size."""
    if seconds < SAY_ABOVE_S:
        return None
    return (
        f"estimate: a step of {episodes} episodes (rollout.prompts_per_step x rollout.num_generations) of up to "
        f"{turns} turns x {budget} tokens after a {prompt_tokens}-token prompt takes about {seconds / 60:.0f} minutes "
        "on this CPU as loaded now (two forward passes timed at start); fewer episodes, turns (task.max_turns) or "
        "tokens a turn (rollout.max_new_tokens) make it shorter"
    )
