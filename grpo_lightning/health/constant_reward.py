"""A reward function that never fired: one value for every completion since the run began.

A strict reward (the answer must sit in ``<answer>`` tags the model does not write yet) scores
every completion 0.0 from the first batch; the reward-signal check waits for a full window of
steps, and with dynamic sampling every group is filtered out so no optimizer step completes.
This check counts rollout batches (its ``measure`` runs once per generation batch, whatever the
optimizer did) and speaks after ``batches`` of them, naming the function, its value and three
completions it scored. A function that never varies while the others do is reported too: it
adds a constant and teaches nothing.

Per function it sums the count, the sum and the sum of squares of its values over ranks (so
every rank reaches the same verdict); the variance since the start is zero exactly when every
value was the same. A resumed run (first batch not 0) is not judged: "since the start" is gone.
Failed episodes (loss mask 0 throughout) are not counted: an environment that raises on every step
is the ``episode_failures`` check's finding, not a reward format that never matched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from grpo_lightning.config.base import check, option
from grpo_lightning.config.health import PATIENCE_HELP, CheckConfig
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, register_check
from grpo_lightning.health.view import StepView

SAMPLES = 3  # completions quoted in the alert


def _quoted(text: str, limit: int = 80) -> str:
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


@dataclass
class ConstantRewardCheckConfig(CheckConfig):
    """A reward function that has returned one value since the start of the run."""

    patience: int = option(1, PATIENCE_HELP)
    batches: int = option(
        3, "Alert when a reward function has returned one value since the run's first this many batches."
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, self.batches >= 1, f"{p}batches={self.batches} must be >= 1")
        return problems


@register_check(ConstantRewardCheckConfig)
class ConstantRewardCheck(HealthCheck):
    name = "constant_reward"
    failure = "F4"
    title = "a reward function has returned one value since the start"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._sums: dict[str, np.ndarray] = {}  # function -> (count, sum, sum of squares) since the start
        self._batches = 0
        self._judged = True  # False once the run is seen to be resumed, or every function has varied
        self._constant: list[str] = []

    def measure(self, view: StepView) -> dict[str, float]:
        out: dict[str, float] = {}
        # Rows the loss leaves out entirely (a failed episode) score the environment's failure, not the
        # reward function: the episode_failures check speaks for them.
        mask = getattr(view.rollout, "loss_mask", None)
        trained = None if mask is None else mask.any(dim=1).cpu().numpy()
        for name, values in view.rollout.reward_components.items():
            v = values.detach().double().cpu().numpy()
            v = v if trained is None else v[trained]
            v = v[~np.isnan(v)]  # None: the function does not apply to that sample
            out[f"{name}/n"], out[f"{name}/sum"], out[f"{name}/sumsq"] = float(v.size), float(v.sum()), float(v @ v)
        return out

    def _constant_since_start(self, name: str) -> bool:
        n, total, squares = self._sums[name]
        if n == 0:
            return False
        mean = total / n
        return squares / n - mean * mean <= 1e-12 * max(1.0, mean * mean)

    def evaluate(self, t: dict[str, float], view: StepView) -> tuple[dict[str, float], Finding | None]:
        if self._batches == 0 and view.step != 0:
            self._judged = False
        self._batches += 1
        for key, value in t.items():
            name, field = key.rsplit("/", 1)
            sums = self._sums.setdefault(name, np.zeros(3))
            sums[("n", "sum", "sumsq").index(field)] += value
        constant = [name for name in self._sums if self._constant_since_start(name)]
        metrics = {"constant_functions": float(len(constant))}
        if not constant:
            self._judged = False  # every function has varied: nothing left to find in this run
        if not self._judged or self._batches < self.cfg.batches:
            return metrics, None
        self._constant = constant
        lines = []
        for name in constant:
            n, total, _ = self._sums[name]
            lines.append(f"reward function {name!r} returned {total / n:.4g} for all {n:.0f} completions scored")
        varying = [name for name in self._sums if name not in constant]
        others = f"; the others ({', '.join(map(repr, varying))}) do vary" if varying else ""
        quoted = ", ".join(_quoted(c) for c in view.rollout.completions[:SAMPLES])
        evidence = (
            f"{'; '.join(lines)} since the start of the run ({self._batches} rollout batches){others}. "
            f"Completions it scored: {quoted}"
        )
        self._judged = False  # said once
        return metrics, Finding(evidence, {**metrics, "batches": float(self._batches)})

    def diagnosis(self, view: StepView) -> tuple[str, str]:
        names = ", ".join(map(repr, self._constant)) or "the reward function"
        causes = (
            f"{names} never matched (or always did: then it teaches nothing): the completions are not in the format it parses (e.g. an answer "
            f"inside tags the model does not write yet), it reads the wrong dataset column, or it "
            f"compares the answer as another type (a number against a string)."
        )
        fix = (
            f"call {names} on the completions quoted above and on a correct one, by hand; state the "
            f"expected format in task.instruction or task.system_prompt; add a partial-credit format "
            f"reward to task.rewards; check the column it reads against the dataset's."
        )
        return causes, fix
