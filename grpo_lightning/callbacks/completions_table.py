"""``CompletionsTable``: every N steps, a wandb table of sample completions.

Why: a reward curve says *that* the policy changed, a table says *how* (formatting tricks,
reward hacking, repetition). One row per completion: step, prompt, completion, each reward
function's score, the total reward and the group-relative advantage the step trained on; with
images, which images the prompt had (paths or pixel hashes; the wandb table shows the first); for
an episode task also its turns, each with the mask the loss used, its stop reason and turn count.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.loggers import WandbLogger

from grpo_lightning.environments.transcripts import turns_text


def completion_rows(rollout, advantages, max_rows: int) -> tuple[list[str], list[list]]:
    """Columns and rows of one table (the first ``max_rows`` completions, whole groups first); an
    episode's row adds its turns (``[role mask] text`` per turn), stop reason and turn count."""
    names = list(rollout.reward_components)
    columns = ["step", "prompt", "completion", *[f"reward/{n}" for n in names], "reward", "advantage"]
    vision = getattr(rollout, "vision", None)
    if vision is not None:
        columns.append("images")  # each prompt's images: their paths, or their pixel hashes
    episodes = getattr(rollout, "episodes", None) or []
    if episodes:
        columns += ["turns", "stop_reason", "num_turns"]
    rows = []
    for i in range(min(max_rows, rollout.num_sequences)):
        row = [
            rollout.step,
            rollout.prompts[i] if rollout.prompts else "",
            rollout.completions[i] if rollout.completions else "",
            *[float(rollout.reward_components[n][i]) for n in names],
            float(rollout.rewards[i]),
            float(advantages[i]),
        ]
        if vision is not None:
            row.append(list(vision[i].refs) if vision[i] is not None else [])
        if episodes:
            row += [turns_text(episodes[i]), episodes[i]["stop_reason"], episodes[i]["num_turns"]]
        rows.append(row)
    return columns, rows


def with_pictures(rollout, columns: list[str], rows: list[list]) -> tuple[list[str], list[list]]:
    """A wandb table's columns and rows with each prompt's first image shown (``image``), where it has one."""
    vision = getattr(rollout, "vision", None)
    if vision is None:
        return columns, rows
    import wandb  # noqa: PLC0415 - only a run that logs to wandb gets here

    pictures = [wandb.Image(v.images[0]) if v is not None and v.images else None for v in vision[: len(rows)]]
    return [*columns, "image"], [[*row, picture] for row, picture in zip(rows, pictures, strict=True)]


class CompletionsTable(L.Callback):
    """Logs ``completions`` (a ``wandb.Table``) to every WandbLogger of the trainer every ``every_n_steps``."""

    def __init__(self, every_n_steps: int = 10, max_rows: int = 16, key: str = "completions"):
        self.every_n_steps = every_n_steps
        self.max_rows = max_rows
        self.key = key
        self.tables_logged = 0

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = pl_module.last_step
        if step is None or step.rollout is None or self.every_n_steps <= 0 or batch_idx % self.every_n_steps:
            return
        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if not loggers or trainer.global_rank != 0:
            return
        columns, rows = completion_rows(step.rollout, step.advantages.cpu(), self.max_rows)
        columns, rows = with_pictures(step.rollout, columns, rows)
        for logger in loggers:
            logger.log_table(key=self.key, columns=columns, data=rows, step=trainer.global_step)
        self.tables_logged += 1
