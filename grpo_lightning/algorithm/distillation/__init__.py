"""On-policy distillation, the math: a teacher's per-token signal on the student's own samples.

Two registered objectives (``algorithm.teacher.objective``): ``reverse_kl``, the sampled-token
reverse KL as a per-token advantage through the policy loss (:mod:`.reverse_kl`), and ``jsd``,
the generalised Jensen-Shannon divergence of the full distributions, chunked over the vocabulary
(:mod:`.jsd`). :mod:`.mixing` puts the teacher term beside the group-relative reward advantages.
Pure tensor math: no Lightning, no config.
"""

from grpo_lightning.algorithm.distillation.divergence import HeadRows, divergence_rows, shared_vocab
from grpo_lightning.algorithm.distillation.jsd import ChunkedJSD, JSDOptions, chunked_jsd, jsd_from_logits
from grpo_lightning.algorithm.distillation.mixing import (
    DISTILL_SUMS,
    distill_sums,
    mixed_advantages,
    teacher_active,
    teacher_in_advantages,
    teacher_options,
)
from grpo_lightning.algorithm.distillation.objectives import (
    TEACHER_OBJECTIVES,
    DistillInputs,
    TeacherObjective,
    register_teacher_objective,
)
from grpo_lightning.algorithm.distillation.reverse_kl import ReverseKLOptions, discounted_sums, reverse_kl_advantages

__all__ = [
    "DISTILL_SUMS",
    "TEACHER_OBJECTIVES",
    "ChunkedJSD",
    "DistillInputs",
    "HeadRows",
    "JSDOptions",
    "ReverseKLOptions",
    "TeacherObjective",
    "chunked_jsd",
    "discounted_sums",
    "distill_sums",
    "divergence_rows",
    "jsd_from_logits",
    "mixed_advantages",
    "register_teacher_objective",
    "reverse_kl_advantages",
    "shared_vocab",
    "teacher_active",
    "teacher_in_advantages",
    "teacher_options",
]
