"""IcePop (slime, AReaL; verl ``rollout_is_threshold="0.5_5.0"``): a two-sided band on the token
ratio, ``w_t = r_t`` if ``lower <= r_t <= upper`` else 0, multiplying the clipped PPO term. The
mask, hence the denominator, is unchanged: a token outside the band contributes 0 but still counts."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.algorithm.corrections.base import help_field, register_correction
from grpo_lightning.algorithm.corrections.mis_token import BandedTokenRatio, band_problems


@dataclass
class IcepopOptions:
    """IcePop's band on the token ratio: w_t = r_t inside [lower, upper], else 0."""

    lower: float = help_field(0.5, "Lower end a of IcePop's band on pi_train / pi_eng (>= 0).")
    upper: float = help_field(5.0, "Upper end b of IcePop's band on pi_train / pi_eng (> lower).")

    def check_fields(self, p: str) -> list[str]:
        return band_problems(p, self.lower, self.upper)


@register_correction("icepop", options=IcepopOptions)
class Icepop(BandedTokenRatio):
    pass
