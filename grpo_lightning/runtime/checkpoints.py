"""Checkpoints every N steps, exact resume, a clean stop on SIGINT / SIGTERM, and the exported model.

:class:`RunCheckpoints` (a Lightning callback, added by ``build_run``) writes
``<output_dir>/checkpoints/step_<N>.ckpt`` every ``trainer.checkpoint_every_n_steps``
optimizer steps and at the last step, atomically (written under a temporary name, then
renamed: a kill mid-write leaves the previous checkpoints intact and never a partial
"latest"), keeping the newest ``trainer.keep_checkpoints``. It writes the policy as a
Hugging Face folder to ``<output_dir>/hf/final`` at the end (and ``hf/step_<N>`` every
``trainer.export_every_n_steps``).

What a checkpoint holds, so that a resumed run continues exactly as an uninterrupted one:
weights (policy and reference), optimizer and scheduler (Lightning), the loop counters
(Lightning; the rollout seeds derive from ``fit_loop.total_batch_idx``), the prompt loader's
position (:class:`~grpo_lightning.data.resumable.ResumableLoader`), the NaN counters
(``GRPOModule.on_save_checkpoint``), the health monitor's memory (``HealthMonitor.state_dict``)
and every RNG (torch, CUDA, numpy, Python; here). In async generation the batches in flight
at the checkpoint (generated for the next ``max_staleness`` steps with older weights) are
waited for and saved as they came out (``AsyncRolloutGenerator.state_dict``): regenerating
them with their original seeds would sample from the checkpoint's newer weights and change
the run, so the resumed run trains on exactly the batches the uninterrupted one did.

Checkpoints are data, never code: all of that is tensors, numbers, strings, lists and dicts
(:mod:`~grpo_lightning.records.plain_state`), and :func:`fit_refusing_code` resumes with
``torch.load(weights_only=True)``, so a checkpoint holding any other object (a crafted one
whose unpickling would run code) is refused with a :class:`CheckpointError` before it runs.

Each checkpoint has a SHA-256 sidecar (:mod:`~grpo_lightning.runtime.checksums`), checked on
resume: ``trainer.resume=auto`` skips a corrupt one for the newest good one (saying which), an
explicit corrupt path is a :class:`CheckpointError`. Each also stores the run's config, and a resume
that would not continue exactly is refused (:mod:`~grpo_lightning.runtime.resume_check`). A write
that fails (disk full) leaves no temporary file and the previous checkpoints intact, and ends the
run with one line; so does a failed export, after saving a checkpoint if the step had none.

On SIGINT or SIGTERM the run finishes the current step, writes a checkpoint and
``hf/step_<N>``, says where, and stops; the CLI then exits with 128 + the signal number. A second
signal stops at once (:mod:`~grpo_lightning.runtime.stop_signals`). When the non-finite guard stops
the run, the last good weights (the current ones: the guard skipped the bad steps) are saved and
its message says where.
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
from pathlib import Path
from pickle import UnpicklingError  # the error of torch.load(weights_only=True); nothing is unpickled here

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_only

from grpo_lightning.errors import CheckpointError, UserError
from grpo_lightning.models.lora import full_state_dict
from grpo_lightning.models.sharding import is_sharded
from grpo_lightning.records.plain_state import RefusedState
from grpo_lightning.runtime import checksums
from grpo_lightning.runtime.export import export_hf
from grpo_lightning.runtime.resume_check import (
    CONFIG_KEY,
    NOT_PLAIN_DATA,
    apply_optimizer_settings,
    check_resume,
    resume_note,
    unreadable,
)
from grpo_lightning.runtime.stop_signals import StopSignals
from grpo_lightning.step.guards import NonFiniteTrainingError

CHECKPOINT_DIR = "checkpoints"
# Lightning's save flag (not torch.load's): write optimizer, loops and callbacks too. Said explicitly
# so Lightning does not log "weights_only was not set" on every save.
SAVE_WEIGHTS_ONLY = False


@rank_zero_only
def say(message: str) -> None:
    """A line for the user on stderr (rank zero only)."""
    print(f"[grpo_lightning] {message}", file=sys.stderr, flush=True)


_NAME = re.compile(r"^step_(\d+)\.ckpt$")


def checkpoints_in(output_dir: str | Path) -> list[Path]:
    """The complete checkpoints under ``<output_dir>/checkpoints``, oldest first."""
    folder = Path(output_dir) / CHECKPOINT_DIR
    found = [(int(m.group(1)), p) for p in folder.glob("step_*.ckpt") if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def resume_path(resume: str | None, output_dir: str | Path) -> Path | None:
    """The checkpoint ``trainer.resume`` points to: None (start fresh), ``auto`` (the newest whose
    checksum holds) or a path (refused when its checksum does not)."""
    if resume is None:
        return None
    if resume != "auto":
        return _verified(Path(resume))
    folder = Path(output_dir) / CHECKPOINT_DIR
    found = checkpoints_in(output_dir)
    if not found:
        say(f"trainer.resume=auto: no checkpoint under {folder}; starting fresh")
        return None
    for path in reversed(found):
        problem = checksums.check(path)
        if problem not in (None, "missing"):
            say(f"trainer.resume=auto: skipping corrupt checkpoint {path}: {problem}")
            continue
        _verified(path, problem)
        say(f"trainer.resume=auto: resuming from {path}")
        return path
    raise CheckpointError(
        f"trainer.resume=auto: every checkpoint under {folder} is corrupt (checksums do not match); "
        f"move them away to start fresh, or resume from a copy with trainer.resume=<path>"
    )


def _verified(path: Path, problem: str | None = "unchecked") -> Path:
    """``path`` when its checksum holds or it has none (said once); else a :class:`CheckpointError`."""
    if problem == "unchecked":
        problem = checksums.check(path)
    if problem == "missing":
        say(f"checkpoint {path} has no checksum file (written before checksums): resuming from it unverified")
    elif problem is not None:
        raise CheckpointError(
            f"checkpoint {path} is corrupt: {problem}; resume from another one (trainer.resume=auto takes the "
            f"newest good one)"
        )
    return path


def fit_refusing_code(trainer: L.Trainer, module, datamodule, ckpt_path: str | Path | None) -> None:
    """``trainer.fit``, resuming from ``ckpt_path`` as plain data only (``weights_only=True``): a
    checkpoint holding any other object is refused with a :class:`CheckpointError` naming the file,
    raised outside the handler so that torch's advice (turn the weights-only load off) is not passed on."""
    refused = None
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except UnpicklingError as err:
        if ckpt_path is None or "weights only load failed" not in str(err).lower():
            raise
        refused = f"checkpoint {ckpt_path} {NOT_PLAIN_DATA}"
    except RefusedState as err:  # from a state's load_state_dict, which does not know the file
        refused = f"checkpoint {ckpt_path}: {err}"
    except RuntimeError as err:  # torch's zip reader on a truncated file; load_state_dict on other shapes
        said = str(err)
        if ckpt_path is None or not any(m in said for m in ("PytorchStreamReader", "Error(s) in loading state_dict")):
            raise
        refused = (
            unreadable(ckpt_path, err)
            if "PytorchStreamReader" in said
            else (
                f"checkpoint {ckpt_path} holds weights of another model ({said.splitlines()[0][:200]}); resume with the "
                f"model it was written with, or start fresh in another trainer.output_dir"
            )
        )
    if refused is not None:
        raise CheckpointError(refused)


def rng_state() -> dict:
    """Every RNG as plain data: numpy's state as its key tensor and numbers, Python's as a list of ints."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RunCheckpoints(L.Callback):
    """Periodic atomic checkpoints, the exported model, and the stop on SIGINT / SIGTERM."""

    def __init__(
        self,
        output_dir: str | Path,
        tokenizer,
        every_n_steps: int = 0,
        keep: int = 2,
        export_every_n_steps: int = 0,
        handle_signals: bool = True,
        config: dict | None = None,
        allow_changes: bool = False,
    ):
        self.output_dir = Path(output_dir)
        self.tokenizer = tokenizer
        self.every_n_steps = every_n_steps
        self.keep = keep
        self.export_every_n_steps = export_every_n_steps
        self.handle_signals = handle_signals
        self.config = config  # the run's config as JSON-able data (resume_check.config_record)
        self.allow_changes = allow_changes
        self.interrupted: int | None = None  # the signal number that stopped the run
        self.last_checkpoint: Path | None = None
        self.last_export: Path | None = None
        self.signals = StopSignals()
        self._rng_to_restore: dict | None = None
        self._last_step = 0
        self._resumed = False

    # ----------------------------------------------------------------------- state
    def state_dict(self) -> dict:
        return {"rng": rng_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        rng = state_dict.get("rng")
        if rng is not None and "numpy" not in rng:
            raise RefusedState.pickled("RNG state")
        self._rng_to_restore = rng

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        if self.config is not None:
            checkpoint[CONFIG_KEY] = self.config

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        check_resume(checkpoint, self.config, trainer.max_steps, self.allow_changes, trainer.ckpt_path)
        self._resumed = True
        if (note := resume_note(checkpoint, self.config, trainer.ckpt_path)) is not None:
            say(note)
        # A run's last checkpoint is written at its last batch, which Lightning marks as the
        # end of the (one) epoch: resumed with a larger trainer.max_steps it would stop at
        # once ("max_epochs=1 reached"). The epoch now has more batches (build_datamodule),
        # so that batch was not the last: say so before the loops load their state.
        if trainer.max_steps > checkpoint.get("global_step", 0):
            progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
            if progress is not None:
                progress["is_last_batch"] = False

    # ----------------------------------------------------------------------- hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step
        if self._rng_to_restore is not None:  # as it was right after the checkpointed step
            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
        if self._resumed and self.config is not None:  # the optimizer state restored holds the old lr
            apply_optimizer_settings(trainer, self.config)
        if self.handle_signals:
            self.signals.install()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step, last = trainer.global_step, self._last_step
        self._last_step = step
        stop = self.signals.agreed(trainer)  # every rank, every step: the same decision everywhere
        if stop is not None:
            self.interrupted = stop
            path = self.save(trainer)
            export = self.export(trainer, pl_module, f"step_{step}")
            say(
                f"stopped by {signal.Signals(stop).name} after step {step}: "
                f"checkpoint {path}, model {export}; continue with trainer.resume=auto"
            )
            trainer.should_stop = True
            return
        if step == last:  # no optimizer step (skipped as non-finite): nothing new to save
            return
        every, export_every = self.every_n_steps, self.export_every_n_steps
        if every and (step // every > last // every or step >= trainer.max_steps):
            self.save(trainer)
        if export_every and step // export_every > last // export_every:
            self.export(trainer, pl_module, f"step_{step}")

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.signals.restore()
        if self.interrupted is None:
            self.export(trainer, pl_module, "final")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.signals.restore()
        if isinstance(exception, NonFiniteTrainingError):
            exception.args = (f"{exception} {self._save_last_good(trainer)}",)
        elif (
            isinstance(exception, UserError) and not isinstance(exception, CheckpointError) and self._can_save(trainer)
        ):
            self._save_on_failure(trainer, exception)

    def _save_last_good(self, trainer: L.Trainer) -> str:
        """Save the weights the guard kept (unless a checkpoint of this step holds them); where, in words."""
        path = self.output_dir / CHECKPOINT_DIR / f"step_{trainer.global_step:08d}.ckpt"
        try:
            if not path.exists():
                path = self.save(trainer)
        except CheckpointError as err:
            return f"The last good weights could not be saved: {err}"
        return f"The last good weights are saved in {path}: continue from them with trainer.resume=auto."

    def _can_save(self, trainer: L.Trainer) -> bool:
        """Checkpoints are on, a step was taken, and one rank (several would wait in the save's barrier)."""
        return bool(self.every_n_steps and trainer.global_step and trainer.world_size == 1)

    def _save_on_failure(self, trainer: L.Trainer, exception: BaseException) -> None:
        """A user error mid-run (a reward function that raised or exited): keep the steps done, and say
        where in the error's one line. Not with several ranks: the others would wait in the save's barrier."""
        target = self.output_dir / CHECKPOINT_DIR / f"step_{trainer.global_step:08d}.ckpt"
        try:
            if not target.exists():
                _forget_unfinished_batch(trainer)
            path = target if target.exists() else self.save(trainer)
        except Exception as err:  # noqa: BLE001  (the user's error stays the one reported)
            exception.args = (f"{exception} (saving a checkpoint failed too: {type(err).__name__}: {err})",)
            return
        exception.args = (f"{exception}; steps up to {trainer.global_step} are saved in {path}",)

    # ----------------------------------------------------------------------- writing
    def save(self, trainer: L.Trainer) -> Path:
        """``trainer.save_checkpoint`` under a temporary name, its checksum, then renamed into place;
        prune old ones. A failed write (disk full) removes the temporary file and raises one line."""
        folder = self.output_dir / CHECKPOINT_DIR
        target = folder / f"step_{trainer.global_step:08d}.ckpt"
        staging = folder / f".{target.name}.tmp"
        failed, written = None, False
        try:
            trainer.save_checkpoint(staging, weights_only=SAVE_WEIGHTS_ONLY)
            written = True
            if trainer.is_global_zero:
                with open(staging, "rb") as handle:
                    os.fsync(handle.fileno())
                checksums.write_checksum(staging, target)
                os.replace(staging, target)
                for old in checkpoints_in(self.output_dir)[: -self.keep]:
                    old.unlink(missing_ok=True)
                    checksums.sidecar(old).unlink(missing_ok=True)
        except OSError as err:
            failed = err
            staging.unlink(missing_ok=True)
            if not written and trainer.world_size > 1:
                trainer.strategy.barrier()  # the one save_checkpoint did not reach
        if _any_rank(trainer, failed is not None):
            previous = self.last_checkpoint or (checkpoints_in(self.output_dir) or [None])[-1]
            raise CheckpointError(
                f"cannot write checkpoint {target}: {_reason(failed)}; "
                f"{f'the previous checkpoint {previous} is intact' if previous else 'no earlier checkpoint'}. "
                f"Free space under {folder} (or lower trainer.keep_checkpoints), then continue with "
                f"trainer.resume=auto"
            ) from failed
        self.last_checkpoint = target
        return target

    def export(self, trainer: L.Trainer, pl_module, name: str) -> Path:
        """The policy as ``hf/<name>``; a failed write keeps (or first saves) the step's checkpoint."""
        folder = self.output_dir / "hf" / name
        # trainer.strategy=fsdp: every rank gathers the shards (a collective), rank 0 writes them.
        state = full_state_dict(pl_module.policy) if is_sharded(pl_module.policy) else None
        failed = None
        if trainer.is_global_zero:
            try:
                export_hf(pl_module.policy, self.tokenizer, folder, state=state)
            except OSError as err:
                failed = err
        if _any_rank(trainer, failed is not None):
            path = self.output_dir / CHECKPOINT_DIR / f"step_{trainer.global_step:08d}.ckpt"
            kept = path if path.exists() else self.save(trainer)
            raise CheckpointError(
                f"cannot write the model to {folder}: {_reason(failed)}; the run's checkpoint {kept} is intact: "
                f"free space, then export it by resuming from it"
            ) from failed
        self.last_export = folder
        return folder


def _any_rank(trainer: L.Trainer, failed: bool) -> bool:
    """Whether any rank failed (one all-reduce with several ranks): all raise together, none hangs."""
    return trainer.strategy.reduce_boolean_decision(failed, all=False) if trainer.world_size > 1 else failed


def _reason(err: OSError | None) -> str:
    return (err.strerror or str(err)) if err is not None else "it failed on another rank"


def _forget_unfinished_batch(trainer: L.Trainer) -> None:
    """The step that raised had fetched its batch (Lightning counted it ready and started) but never
    processed it. Count it as never begun, so the checkpoint resumes at that batch, with the seeds of
    its step (they derive from ``fit_loop.total_batch_idx``, which Lightning restores as saved)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    for counts in (progress.total, progress.current):
        counts.ready = counts.started = counts.processed
