"""Off-policy corrections between the engine's and the trainer's log-probs, one file each,
registered in :data:`CORRECTIONS` and selected as ``algorithm.corrections=[icepop, ...]`` with
their options at ``algorithm.<name>.*`` (docs/corrections.md)."""

from grpo_lightning.algorithm.corrections import (  # noqa: F401  (each registers itself)
    geo_mask,
    icepop,
    k3_seq_mask,
    mis_seq,
    mis_token,
    opsm,
    rejection,
    tis_seq,
    tis_token,
    veto,
)
from grpo_lightning.algorithm.corrections.base import (
    CORRECTIONS,
    LEVELS,
    Band,
    Correction,
    CorrectionInputs,
    CorrectionOutput,
    register_correction,
)
from grpo_lightning.algorithm.corrections.select import (
    CORRECTION_MODES,
    apply_corrections,
    correction_problems,
    selected_corrections,
)

__all__ = [
    "CORRECTIONS",
    "CORRECTION_MODES",
    "LEVELS",
    "Band",
    "Correction",
    "CorrectionInputs",
    "CorrectionOutput",
    "apply_corrections",
    "correction_problems",
    "register_correction",
    "selected_corrections",
]
