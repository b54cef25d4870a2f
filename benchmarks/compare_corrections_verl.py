"""Compare our registered corrections with verl's rollout-correction functions on random cases.

verl is not a dependency: its ``verl/trainer/ppo/rollout_corr_helper.py`` is read from a checkout
(``--verl PATH``: a work tree, or a bare/mirror git dir read with ``git show HEAD:...``) and executed
here with stand-ins for the three verl modules it imports (only ``masked_sum`` / ``masked_mean`` are
used by the functions compared; the stand-ins follow verl's definitions). Nothing of verl is
copied into the package.

    python benchmarks/compare_corrections_verl.py --verl /path/to/verl [--cases 300]

Mapping (docs/corrections.md): tis_token / tis_seq <-> rollout_is=token / sequence;
geo_mask(lower, upper) <-> rollout_rs=seq_mean_k1 with "1/upper_1/lower" (verl's k1 is
log pi_eng / pi_train); k3_seq_mask <-> seq_mean_k3; rejection(estimator, aggregation) <->
"<aggregation>_<estimator>". mis_*, icepop, opsm and veto have no counterpart in verl's helper.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

import torch

from grpo_lightning.algorithm.corrections import CORRECTIONS, CorrectionInputs
from grpo_lightning.algorithm.corrections.geo_mask import GeoMaskOptions
from grpo_lightning.algorithm.corrections.k3_seq_mask import K3SeqMaskOptions
from grpo_lightning.algorithm.corrections.rejection import RejectionOptions
from grpo_lightning.algorithm.corrections.tis_seq import TisSeqOptions
from grpo_lightning.algorithm.corrections.tis_token import TisTokenOptions

HELPER = "verl/trainer/ppo/rollout_corr_helper.py"


def _source(verl: Path) -> str:
    if (verl / HELPER).is_file():
        return (verl / HELPER).read_text()
    return subprocess.run(
        ["git", "--git-dir", str(verl if (verl / "HEAD").exists() else verl / ".git"), "show", f"HEAD:{HELPER}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def load_verl_helper(verl: Path) -> types.ModuleType:
    """verl's helper module, with stand-ins for the imports the compared functions do not need."""

    def masked_sum(values, mask, axis=None):
        return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)

    def masked_mean(values, mask, axis=None):
        return masked_sum(values, mask, axis) / (mask.sum(axis=axis) + 1e-8)

    stubs = {
        "verl": {},
        "verl.utils": {},
        "verl.utils.torch_functional": {"masked_sum": masked_sum, "masked_mean": masked_mean},
        "verl.protocol": {"DataProto": object},
        "verl.trainer": {},
        "verl.trainer.config": {},
        "verl.trainer.config.algorithm": {"RolloutCorrectionConfig": object},
        "verl.workers": {},
        "verl.workers.config": {},
        "verl.workers.config.actor": {"PolicyLossConfig": object},
    }
    for name, attrs in stubs.items():
        module = sys.modules.setdefault(name, types.ModuleType(name))
        for key, value in attrs.items():
            setattr(module, key, value)
    sys.modules["verl.utils"].torch_functional = sys.modules["verl.utils.torch_functional"]
    helper = types.ModuleType("verl_rollout_corr_helper")
    exec(compile(_source(verl), HELPER, "exec"), helper.__dict__)  # noqa: S102  (a benchmark, reading verl's own file)
    return helper


def random_case(g: torch.Generator, rows: int = 16, cols: int = 48):
    scale = float(torch.empty(()).uniform_(0.001, 1.0, generator=g))
    engine = -torch.rand(rows, cols, generator=g) * 4
    train = engine + torch.randn(rows, cols, generator=g) * scale
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    mask = (torch.arange(cols)[None] < lengths[:, None]).float()
    if float(torch.rand((), generator=g)) < 1 / 3:  # log-ratios beyond +-20, where the per-token clamp decides
        at = (torch.rand(rows, 2, generator=g) * lengths[:, None]).long()
        size = 20.0 + torch.rand(rows, 2, generator=g) * 40.0
        row = torch.arange(rows)
        train[row, at[:, 0]] = engine[row, at[:, 0]] + size[:, 0]
        train[row, at[:, 1]] = engine[row, at[:, 1]] - size[:, 1]
    return train, engine, mask


def cases(ours_name: str, options, verl_call):
    """(our correction, options, a function (log_ratio, mask) -> verl's weight or mask)."""
    return ours_name, options, verl_call


def comparisons(helper):
    weights = helper.compute_rollout_correction_weights
    reject = helper.compute_rollout_rejection_mask
    out = [
        cases("tis_token", TisTokenOptions(2.0), lambda d, m: weights(d, m, "token", 2.0)[0]),
        cases("tis_seq", TisSeqOptions(5.0), lambda d, m: weights(d, m, "sequence", 5.0)[0]),
        cases(
            "geo_mask",
            GeoMaskOptions(lower=0.98, upper=1.01),
            lambda d, m: reject(d, m, "seq_mean_k1", f"{1 / 1.01}_{1 / 0.98}")[0],
        ),
        cases("k3_seq_mask", K3SeqMaskOptions(0.01), lambda d, m: reject(d, m, "seq_mean_k3", 0.01)[0]),
    ]
    for aggregation in ("token", "seq_sum", "seq_mean", "seq_max"):
        for estimator in ("k1", "k2", "k3"):
            if (aggregation, estimator) == ("seq_max", "k1"):
                continue
            if estimator == "k1":
                options, spec = RejectionOptions(estimator, aggregation, upper=1.5, lower=0.8), "0.8_1.5"
            else:
                options, spec = RejectionOptions(estimator, aggregation, upper=0.05), 0.05
            option = f"{aggregation}_{estimator}"
            out.append(cases("rejection", options, lambda d, m, o=option, s=spec: reject(d, m, o, s)[0]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl", type=Path, required=True, help="a verl checkout or git dir")
    parser.add_argument("--cases", type=int, default=300)
    args = parser.parse_args()
    helper = load_verl_helper(args.verl)
    g = torch.Generator().manual_seed(0)
    print(f"{'correction':<28} {'cases':>6} {'max |dw|':>10} {'mask disagree':>14} {'masked share':>13}")
    for name, options, verl_call in comparisons(helper):
        worst, disagree, masked, tokens = 0.0, 0, 0, 0
        for _ in range(args.cases):
            train, engine, mask = random_case(g)
            ours = CORRECTIONS[name](options)(CorrectionInputs(train, engine, mask, torch.zeros(mask.shape[0])))
            theirs = verl_call(train - engine, mask)
            on = mask > 0
            tokens += int(on.sum())
            if ours.weight is not None:
                worst = max(worst, float((ours.weight - theirs)[on].abs().max()))
            else:
                keep_verl = theirs > 0.5
                disagree += int((ours.keep != keep_verl)[on].sum())
                masked += int((~ours.keep)[on].sum())
        label = name if name != "rejection" else f"rejection {options.aggregation}_{options.estimator}"
        print(f"{label:<28} {args.cases:>6} {worst:>10.2e} {disagree / tokens:>14.2e} {masked / tokens:>13.3f}")


if __name__ == "__main__":
    main()
