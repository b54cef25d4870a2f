"""``report.png``: one picture of a run, readable without wandb.

Panels: reward (mean and per function), KL, entropy, completion length (mean, min-max band),
held-out accuracy (and pass@k; episode tasks: val/success), step time, the reward signal
(within-group std, tied groups) and the learning rate; an episode task adds a row: turns and tool
calls, the share of each stop reason, the tools' outcome kinds, and the held-out episodes' reward
and turns. Every health alert is a red line at its step on every panel. Drawn with
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


# The episode row (episode tasks only): (title, metric keys under rollout/episodes/ or a prefix of them).
EPISODES = "rollout/episodes/"
EPISODE_PANELS = (
    ("episodes: turns and tool calls (per episode)", ("turns", "tool_calls", "cut_turns")),
    ("episodes: stop reasons (share)", ("stop/",)),
    ("episodes: tool outcomes (per episode)", ("tool/",)),
    ("held-out episodes: val/reward, val/turns", ()),
)


def episode_series(history: list[dict], panel: tuple[str, ...]) -> dict[str, tuple[list[int], list[float]]]:
    """label -> (steps, values) of an episode panel: plain keys as they are, ``stop/`` as shares of the
    episodes, ``tool/`` the kinds that ever happened."""
    out = {}
    for entry in panel:
        if not entry.endswith("/"):
            steps, values = _series(history, EPISODES + entry)
            if steps:
                out[entry] = (steps, values)
            continue
        keys = sorted({k for row in history for k in row if k.startswith(EPISODES + entry)})
        for key in keys:
            rows = [r for r in history if not _nan(r.get(key)) and r.get(EPISODES + "count")]
            values = [r[key] / r[EPISODES + "count"] if entry == "stop/" else r[key] for r in rows]
            if any(values):
                out[key.removeprefix(EPISODES)] = ([r["step"] for r in rows], values)
    return out


def reward_functions(history: list[dict]) -> list[str]:
    names = {k for row in history for k in row if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2}
    return sorted(names)


def draw_report(path: Path, history: list[dict], validations: list[dict], alerts: list[dict], title: str) -> Path:
    """Write the picture to ``path`` (PNG) and return it."""
    # Fixed margins: matplotlib's constrained layout measures every label and doubles the cost.
    episodes = any(EPISODES + "count" in row for row in history)  # an episode task: a third row of panels
    rows = 3 if episodes else 2
    figure = Figure(figsize=(16, 4.25 * rows))
    figure.subplots_adjust(left=0.04, right=0.99, bottom=0.07, top=0.9, wspace=0.22, hspace=0.25)
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, 4, sharex=True).ravel()
    if episodes:
        _draw_episodes(axes[8:], history, validations)
    for ax, (name, keys) in zip(axes, PANELS, strict=False):
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
    for ax in axes:
        for alert in alerts:
            ax.axvline(alert["step"], color="tab:red", linestyle="--", linewidth=0.9, alpha=0.7)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    for ax in axes[-4:]:
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


def _draw_episodes(axes, history: list[dict], validations: list[dict]) -> None:
    for ax, (name, panel) in zip(axes, EPISODE_PANELS, strict=True):
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
        series = episode_series(history, panel)
        if not panel:  # the held-out episodes' reward and turns
            series = {k: _series(validations, k) for k in ("val/reward", "val/turns") if _series(validations, k)[0]}
        for label, (steps, values) in series.items():
            ax.plot(steps, values, marker="o" if not panel else None, label=label, linewidth=1.0)
        if not series:
            ax.text(0.5, 0.5, "none", ha="center", va="center", transform=ax.transAxes)


def _is_rate(key: str) -> bool:
    return key in ("val/accuracy", "val/success") or key.startswith("val/pass@")
