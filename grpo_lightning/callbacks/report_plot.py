"""``report.png``: one picture of a run, readable without wandb.

Panels: reward (mean and per function), KL, entropy, completion length (mean, min-max band),
held-out accuracy (and pass@k), step time, the reward signal (within-group std, tied groups) and
the learning rate; every health alert is a red line at its step on every panel. Drawn with
matplotlib's object API (no pyplot): nothing global changes, so a notebook's backend is untouched.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

# (title, [(metric key, label)]) of each panel; per-function rewards join the first.
PANELS = (
    ("reward", [("reward/mean", "mean (weighted sum)")]),
    ("KL to the reference", [("kl/mean", "kl/mean")]),
    ("entropy (nats/token)", [("policy/entropy", "policy/entropy")]),
    ("completion length (tokens)", [("completions/mean_length", "mean")]),
    ("held-out evaluation", []),
    ("step time (s)", [("train/step_time", "train/step_time")]),
    ("reward signal", [("reward/std", "within-group std"), ("reward/frac_zero_std", "frac groups tied")]),
    ("learning rate", [("train/lr", "train/lr")]),
)


def _series(history: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(row["step"], row[key]) for row in history if key in row and not _nan(row[key])]
    return [p[0] for p in points], [p[1] for p in points]


def _nan(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def reward_functions(history: list[dict]) -> list[str]:
    names = {k for row in history for k in row if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2}
    return sorted(names)


def draw_report(path: Path, history: list[dict], validations: list[dict], alerts: list[dict], title: str) -> Path:
    """Write the picture to ``path`` (PNG) and return it."""
    # Fixed margins: matplotlib's constrained layout measures every label and doubles the cost.
    figure = Figure(figsize=(16, 8.5))
    figure.subplots_adjust(left=0.04, right=0.99, bottom=0.07, top=0.9, wspace=0.22, hspace=0.25)
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 4, sharex=True).ravel()
    for ax, (name, keys) in zip(axes, PANELS, strict=True):
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        if name == "reward":
            keys = keys + [(k, k.split("/")[1]) for k in reward_functions(history)]
        for key, label in keys:
            steps, values = _series(history, key)
            if steps:
                ax.plot(steps, values, label=label, linewidth=1.4 if key == "reward/mean" else 1.0)
        if name.startswith("completion length"):
            steps, low = _series(history, "completions/min_length")
            _, high = _series(history, "completions/max_length")
            if steps and len(low) == len(high):
                ax.fill_between(steps, low, high, alpha=0.2, label="min-max")
        if name == "held-out evaluation":
            keys = sorted({k for row in validations for k in row if k.startswith("val/") and _is_rate(k)})
            for key in keys:
                steps, values = _series(validations, key)
                ax.plot(steps, values, marker="o", label=key)
            ax.set_ylim(-0.02, 1.02)
            if not keys:
                ax.text(0.5, 0.5, "no held-out evaluation", ha="center", va="center", transform=ax.transAxes)
        for alert in alerts:
            ax.axvline(alert["step"], color="tab:red", linestyle="--", linewidth=0.9, alpha=0.7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    for ax in axes[4:]:
        ax.set_xlabel("step")
    if alerts:
        first = axes[0]
        for alert in alerts:
            first.annotate(
                alert["check"],
                (alert["step"], 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                fontsize=7,
                color="tab:red",
                va="top",
                ha="right",
            )
        title += f"   |   alerts (red lines): {', '.join(sorted({a['check'] for a in alerts}))}"
    figure.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    figure.savefig(tmp, dpi=90, format="png")
    tmp.replace(path)  # a reader never sees half a picture
    return path


def _is_rate(key: str) -> bool:
    return key == "val/accuracy" or key.startswith("val/pass@")
