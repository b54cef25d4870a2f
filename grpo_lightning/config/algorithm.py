"""``algorithm.*``: the GRPO objective (loss, advantages, KL, aggregation) and the optimizer.

The variant names are checked (closest match named) against the registries of :mod:`grpo_lightning.algorithm`, a
lower layer (pure tensor math that imports no config), so a newly registered variant is valid. That package
imports torch, so it is imported only when a name is checked (:meth:`AlgorithmConfig.check_fields`): the CLI
checks everything else (:meth:`AlgorithmConfig.value_problems`) before any heavy import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from grpo_lightning.config.base import check, choice, option
from grpo_lightning.config.nodes import PluginNodes

# micro_batch_size=auto: the largest divisor of the batch up to AUTO_MICRO_BATCH_MAX sequences, or up to
# AUTO_MICRO_BATCH_TOKENS padded tokens when the sequences are short. Short sequences make each pass per-op
# overhead, paid once per micro-batch; the token cap is what 32 sequences of 128 tokens already held.
AUTO_MICRO_BATCH_MAX = 32
AUTO_MICRO_BATCH_TOKENS = 32 * 128
# logprob_chunk_mb=auto: a CPU keeps its memory (the logit blocks were most of a LoRA step's peak above
# the weights); through a frozen head (LoRA's, a reference's) no gradient sum spans blocks, so smaller
# ones cost no time (170 rows of SmolLM2's 49k vocabulary took as long as 512) and cut the peak. A GPU
# takes few, large head matmuls: each chunk also reads and writes the float32 head-weight gradient
# (545 MB on a 152k x 896 head), 100 times a step at 96 MB.
AUTO_LOGPROB_CHUNK_MB = {"cpu": 96.0, "cpu, frozen head": 32.0, "gpu": 1024.0}


def logprob_chunk_mb(value: Any, device_type: str, frozen_head: bool = False) -> float:
    """``algorithm.logprob_chunk_mb`` (a number or auto) in MB for a ``device_type`` ("cpu", "cuda", ...)
    device; ``frozen_head``: the pass's output head does not train (LoRA's, a reference model's)."""
    if value == "auto":
        if device_type != "cpu":
            return AUTO_LOGPROB_CHUNK_MB["gpu"]
        return AUTO_LOGPROB_CHUNK_MB["cpu, frozen head" if frozen_head else "cpu"]
    return float(value)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class AlgorithmConfig(PluginNodes):
    """A policy loss or correction registered with options gets them here, as ``algorithm.<name>.*``
    (``algorithm.sapo.tau_pos``, ``algorithm.icepop.upper``): every node exists, selected or not, so switching
    ``policy_loss`` on the command line never changes which keys are valid."""

    node_registries = ("grpo_lightning.algorithm:POLICY_LOSSES", "grpo_lightning.algorithm.corrections:CORRECTIONS")

    policy_loss: str = option("grpo", "Registered policy loss (grpo_lightning/algorithm/policy_loss.py).")
    advantage_estimator: str = option(
        "grpo", "Registered advantage estimator (grpo_lightning/algorithm/advantages.py)."
    )
    beta: float = option(0.04, "KL coefficient (>= 0); 0 loads no reference model.")
    kl_estimator: str = option("k3", "Registered per-token KL estimator: k1, k2, k3 (grpo_lightning/algorithm/kl.py).")
    kl_bias_correction: bool = option(
        True,
        "KL gradient log(pi/ref) x pi/pi_old x grad log pi: the reverse KL's (TRL's use_bias_correction_kl); false: the estimate's own.",
    )
    loss_agg: str = option(
        "seq_mean_token_mean",
        "Registered loss aggregation of the policy and KL terms (grpo_lightning/algorithm/aggregation.py).",
    )
    advantage_scale: str = option(
        "group",
        "advantage_estimator=grpo: scaling of the centered rewards, group, batch or none (none: Dr. GRPO).",
    )
    advantage_eps: float = option(1e-6, "Added to the std when scaling advantages.")
    num_iterations: int = option(1, "Optimizer passes over each generation batch (mu); 1 makes the ratio exactly 1.")
    micro_batch_size: Any = option(
        "auto",
        "Sequences per forward/backward, dividing prompts_per_step x num_generations; auto: the largest "
        f"<= {AUTO_MICRO_BATCH_MAX}, or more while they hold <= {AUTO_MICRO_BATCH_TOKENS} padded tokens.",
    )
    clip_low: float = option(0.2, "Lower clip of the ratio: 1 - clip_low.")
    clip_high: float = option(0.2, "Upper clip of the ratio: 1 + clip_high (DAPO uses 0.28).")
    dual_clip: Optional[float] = option(None, "Dual-clip bound c > 1 for negative advantages; null turns it off.")
    lr: float = option(3e-4, "AdamW learning rate.")
    weight_decay: float = option(0.0, "AdamW weight decay.")
    warmup_steps: int = option(0, "Linear learning-rate warm-up steps.")
    max_grad_norm: float = option(1.0, "Gradient norm clip (> 0).")
    max_consecutive_skips: int = option(
        3, "Stop with a diagnosis after this many consecutive skipped (non-finite) steps."
    )
    pack_sequences: bool = option(True, "Padding-free training passes: pack each micro-batch's sequences into rows.")
    logprob_chunk_mb: Any = option(
        "auto",
        "Memory budget (MB) of the float32 logits alive at once in the log-prob pass; auto: 96 on a CPU "
        "(32 if the head is frozen), 1024 on a GPU.",
    )
    head_kernels: bool = option(
        True,
        "On a GPU with Triton, the output head's softmax as two kernels, checked once against the eager "
        "path; false: eager.",
    )
    corrections: list[str] = option(
        [],
        "Off-policy corrections by name, combined (docs/corrections.md: icepop, tis_token, ...); options algorithm.<name>.*.",
    )
    correction_mode: str = option(
        "decoupled",
        "Which log-probs are old, decoupled or bypass: the trainer's recompute, or the engine's (bypass).",
    )
    truncated_sampling: str = option(
        "replay",
        "With rollout.top_p < 1 or top_k > 0, replay or refuse: score the engine's kept set, or refuse.",
    )
    is_level: str = option(
        "none", "Deprecated: algorithm.corrections=[tis_token] or [tis_seq]; none, token or sequence."
    )
    is_cap: float = option(2.0, "Deprecated: algorithm.tis_token.cap / tis_seq.cap (with is_level only, > 0).")
    entropy_coef: float = option(0.0, "Entropy bonus: loss -= entropy_coef x aggregate(entropy); 0 turns it off.")
    lr_schedule: str = option("constant", "Learning-rate schedule after the warm-up: constant, linear or cosine.")
    mask_truncated: bool = option(
        False, "Drop completions cut at rollout.max_new_tokens (no EOS) from the loss (DAPO's overlong filtering)."
    )

    def check_fields(self, p: str) -> list[str]:
        from grpo_lightning.algorithm import (  # noqa: PLC0415  (torch: only when names are checked)
            ADVANTAGE_ESTIMATORS,
            ADVANTAGE_SCALES,
            IS_LEVELS,
            KL_ESTIMATORS,
            LOSS_AGG_MODES,
            POLICY_LOSSES,
        )
        from grpo_lightning.algorithm.corrections import (  # noqa: PLC0415  (torch: only when names are checked)
            CORRECTION_MODES,
            correction_problems,
        )
        from grpo_lightning.algorithm.lr_schedule import LR_SCHEDULES  # noqa: PLC0415  (torch: only when names are checked)
        from grpo_lightning.algorithm.truncation import TRUNCATED_SAMPLING  # noqa: PLC0415  (torch: only when names are checked)

        problems: list[str] = []
        for registry in (POLICY_LOSSES, ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGG_MODES):
            field = registry.config_field.rpartition(".")[2]
            if (problem := registry.problem(getattr(self, field), p + field)) is not None:
                problems.append(problem)
        choice(problems, f"{p}advantage_scale", self.advantage_scale, ADVANTAGE_SCALES)
        choice(problems, f"{p}is_level", self.is_level, IS_LEVELS)
        choice(problems, f"{p}correction_mode", self.correction_mode, CORRECTION_MODES)
        choice(problems, f"{p}truncated_sampling", self.truncated_sampling, TRUNCATED_SAMPLING)
        if self.policy_loss in POLICY_LOSSES:
            problems += correction_problems(self, POLICY_LOSSES[self.policy_loss].correction_levels, p)
        choice(problems, f"{p}lr_schedule", self.lr_schedule, LR_SCHEDULES)
        return problems + self.value_problems(p)

    def value_problems(self, p: str) -> list[str]:
        """The rules that need no registry (no torch): what the CLI checks before heavy imports."""
        problems: list[str] = []
        m = self.micro_batch_size
        check(
            problems,
            m == "auto" or (isinstance(m, int) and not isinstance(m, bool) and m >= 1),
            f"{p}micro_batch_size={m!r} must be auto or an int >= 1",
        )
        check(problems, self.beta >= 0, f"{p}beta={self.beta} must be >= 0 (0 turns the KL term off)")
        check(problems, self.num_iterations >= 1, f"{p}num_iterations={self.num_iterations} must be >= 1")
        check(problems, 0 <= self.clip_low < 1, f"{p}clip_low={self.clip_low} must be in [0, 1)")
        check(problems, self.clip_high >= 0, f"{p}clip_high={self.clip_high} must be >= 0")
        check(
            problems, self.dual_clip is None or self.dual_clip > 1, f"{p}dual_clip={self.dual_clip} must be > 1 or null"
        )
        check(problems, self.lr > 0, f"{p}lr={self.lr} must be > 0")
        check(problems, self.max_grad_norm > 0, f"{p}max_grad_norm={self.max_grad_norm} must be > 0")
        check(
            problems,
            self.max_consecutive_skips >= 1,
            f"{p}max_consecutive_skips={self.max_consecutive_skips} must be >= 1",
        )
        mb = self.logprob_chunk_mb
        check(
            problems,
            mb == "auto" or (isinstance(mb, (int, float)) and not isinstance(mb, bool) and mb > 0),
            f"{p}logprob_chunk_mb={mb!r} must be auto or a number > 0",
        )
        check(problems, self.is_cap > 0, f"{p}is_cap={self.is_cap} must be > 0")
        check(problems, self.entropy_coef >= 0, f"{p}entropy_coef={self.entropy_coef} must be >= 0 (0 = off)")
        check(problems, self.warmup_steps >= 0, f"{p}warmup_steps={self.warmup_steps} must be >= 0")
        return problems

    def corrects(self) -> bool:
        """True when the policy term is more than the loss of the ratio: corrections or bypass mode."""
        return bool(self.corrections) or self.is_level != "none" or self.correction_mode == "bypass"

    def micro_batch_problem(self, batch: int, p: str = "algorithm.") -> str | None:
        """An explicit micro_batch_size that does not divide the generation batch, said with its fixes."""
        m = self.micro_batch_size
        if m == "auto" or not isinstance(m, int) or batch % m == 0:
            return None
        return (
            f"{p}micro_batch_size={m} must divide the generation batch rollout.prompts_per_step x "
            f"rollout.num_generations = {batch}; try one of {divisors(batch)[-6:]} or auto"
        )

    def chunk_mb(self, device_type: str) -> float:
        """The log-prob pass's logit budget in MB on a ``device_type`` device: the one place ``auto`` is resolved."""
        return logprob_chunk_mb(self.logprob_chunk_mb, device_type)

    def micro_batch(self, batch: int, width: int = 0) -> int:
        """Sequences per forward/backward for a generation batch of ``batch`` sequences ``width`` tokens
        wide (prompt and completion, padded; 0: unknown): the one place ``auto`` is resolved, the largest
        divisor of ``batch`` up to AUTO_MICRO_BATCH_MAX, or up to AUTO_MICRO_BATCH_TOKENS // width."""
        if self.micro_batch_size != "auto":
            return int(self.micro_batch_size)
        cap = max(AUTO_MICRO_BATCH_MAX, AUTO_MICRO_BATCH_TOKENS // width) if width > 0 else AUTO_MICRO_BATCH_MAX
        return max(d for d in divisors(batch) if d <= cap)
