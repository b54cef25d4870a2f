"""Which corrections a config selects, the rules on their combination, and applying them.

Combination: weights multiply, keep masks combine by AND (a token survives only if every mask
keeps it). Rules refused at config time: an unknown or repeated name; a required option left
unset; a correction whose level the policy loss does not accept (a token-level weight under
GSPO's sequence ratio); a weight in ``bypass`` mode, where the PPO ratio pi_theta / pi_eng is the
importance weight already (verl's bypass ppo_clip applies no IS weight either).
"""

from __future__ import annotations

from typing import Any

import torch

from grpo_lightning.algorithm.corrections.base import CORRECTIONS, Correction, CorrectionInputs, ImportanceWeights
from grpo_lightning.algorithm.corrections.tis_seq import TisSeqOptions
from grpo_lightning.algorithm.corrections.tis_token import TisTokenOptions

CORRECTION_MODES = ("decoupled", "bypass")
LEGACY_IS_LEVELS = {"token": ("tis_token", TisTokenOptions), "sequence": ("tis_seq", TisSeqOptions)}


def selected_corrections(cfg: Any) -> list[Correction]:
    """The corrections of ``cfg.corrections`` built from their nodes ``cfg.<name>``, plus the
    deprecated ``is_level`` / ``is_cap`` (tis_token or tis_seq with ``cap=is_cap``)."""
    built = [CORRECTIONS[name](getattr(cfg, name)) for name in getattr(cfg, "corrections", ())]
    legacy = getattr(cfg, "is_level", "none")
    if legacy in LEGACY_IS_LEVELS:
        name, options = LEGACY_IS_LEVELS[legacy]
        built.append(CORRECTIONS[name](options(cap=cfg.is_cap)))
    return built


def correction_problems(cfg: Any, accepted_levels: tuple[str, ...], p: str = "algorithm.") -> list[str]:
    """Every config-time problem of the selected corrections (one line each, naming the field and the fix)."""
    names = list(getattr(cfg, "corrections", ()))
    problems = [problem for name in names if (problem := CORRECTIONS.problem(name, f"{p}corrections")) is not None]
    if problems:
        return problems
    if len(set(names)) != len(names):
        problems.append(f"{p}corrections={names} names a correction twice; list each once")
    legacy = getattr(cfg, "is_level", "none")
    if legacy in LEGACY_IS_LEVELS:
        clash = [n for n in names if n.startswith("tis_")]
        if clash:
            problems.append(
                f"{p}is_level={legacy} (deprecated) and {p}corrections={names} both select truncated IS; "
                f"drop is_level and use {p}corrections=[{LEGACY_IS_LEVELS[legacy][0]}] {p}{LEGACY_IS_LEVELS[legacy][0]}"
                ".cap=..."
            )
    for name in names:
        node, kind = getattr(cfg, name), CORRECTIONS[name]
        for option in kind.required:
            if getattr(node, option) is None:
                problems.append(
                    f"{p}{name}.{option} is required with {p}corrections=[{name}]: published defaults disagree "
                    "by orders of magnitude (docs/corrections.md); set it"
                )
    if problems:
        return problems
    mode = getattr(cfg, "correction_mode", "decoupled")
    for correction in selected_corrections(cfg):
        where = f"{p}corrections=[{correction.name}]"
        if correction.level not in accepted_levels:
            problems.append(
                f"{where} decides per {correction.level}, but {p}policy_loss={cfg.policy_loss} accepts "
                f"{'/'.join(accepted_levels)}-level corrections only (its ratio is per sequence); pick a sequence-level "
                "one (tis_seq, mis_seq, geo_mask, k3_seq_mask, opsm, veto) or another policy loss"
            )
        if mode == "bypass" and correction.is_weight:
            problems.append(
                f"{where} is an importance weight, and with {p}correction_mode=bypass the PPO ratio pi_theta / pi_eng "
                "already is one (applying both double-counts); use correction_mode=decoupled or a mask correction"
            )
    return problems


def apply_corrections(corrections: list[Correction], x: CorrectionInputs) -> ImportanceWeights:
    """The combined weight and keep mask of ``corrections`` on ``x``, with the mismatch statistics."""
    weight = torch.ones_like(x.log_ratio)
    keep = torch.ones_like(x.on)
    outside = torch.zeros_like(x.on)
    with torch.no_grad():
        for correction in corrections:
            out = correction(x)
            if out.weight is not None:
                weight = weight * out.weight
            if out.keep is not None:
                keep = keep & out.keep
            outside = outside | correction.outside(x)
        weighted = [c for c in corrections if c.is_weight]
        ratio = weighted[0].statistic(x) if weighted else x.token_ratio
        on = x.on
        removed = on & ~keep
        stats = torch.stack(
            [
                x.log_ratio.abs().sum(),
                torch.where(on, ratio, 0.0).amax() if bool(on.any()) else ratio.new_tensor(1.0),
                outside.sum().float(),
                removed.sum().float(),
                removed.any(dim=1).sum().float(),
            ]
        ).tolist()
    return ImportanceWeights(weight, stats[0], stats[1], stats[2], keep, stats[3], stats[4])
