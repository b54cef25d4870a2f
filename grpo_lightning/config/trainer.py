"""``trainer.*``: the Lightning Trainer (steps, devices, strategy, precision) and the run folder."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from grpo_lightning.config.base import Schema, check, choice, option

STRATEGIES = ("auto", "ddp", "fsdp")
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")  # Lightning's registered names
# Lightning's accepted precision strings (lightning.fabric.connector._PRECISION_INPUT_STR).
PRECISIONS = (
    *("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "32", "16", "bf16", "64"),
    *("transformer-engine", "transformer-engine-float16"),
)


@dataclass
class TrainerConfig(Schema):
    max_steps: int = option(2000, "Optimizer steps to run; each generation batch gives algorithm.num_iterations.")
    seed: int = option(0, "Run seed: model init order, data order and every sampling seed derive from it.")
    accelerator: str = option("cpu", "Lightning accelerator: cpu, gpu, auto.")
    devices: int = option(1, "Number of devices (processes) to train on.")
    precision: str = option(
        "32-true", "Lightning precision, e.g. 32-true or bf16-mixed (float32 weights, bf16 compute)."
    )
    strategy: str = option("auto", f"Lightning strategy, one of {STRATEGIES}: ddp replicates, fsdp shards (FSDP2).")
    num_nodes: int = option(1, "Machines to train on (Lightning's num_nodes); devices is per machine.")
    num_threads: int = option(1, "torch intra-op threads on CPU; 0 leaves torch's default.")
    malloc_mmap_threshold: int = option(
        0, "Linux/glibc: fix malloc's mmap threshold at this many bytes so freed tensors return to the OS; 0: off."
    )
    huge_pages: bool = option(
        True, "Linux: large CPU tensors on transparent huge pages (less peak memory); applied at run start."
    )
    log_every_n_steps: int = option(1, "Log metrics every n steps.")
    output_dir: str = option(
        "outputs", "Where logs and checkpoints go; under the CLI Hydra's run folder, which follows it when named."
    )
    enable_checkpointing: bool = option(False, "Save a Lightning checkpoint at the end of training.")
    checkpoint_every_n_steps: int = option(
        0, "Write a resumable checkpoint to <output_dir>/checkpoints/ every n steps and at the last; 0 turns it off."
    )
    keep_checkpoints: int = option(2, "How many of the newest checkpoints under <output_dir>/checkpoints/ to keep.")
    resume: Optional[str] = option(
        None, "auto: the newest checkpoint under <output_dir>/checkpoints/ (if any); a path: that one; null: fresh."
    )
    resume_allow_changes: bool = option(
        False,
        "Resume though model name, task, num_generations, prompts_per_step or seed differ (not exact); other "
        "changes are applied and said.",
    )
    share_outputs: bool = option(
        False,
        "false: the run's output folder is private to your user (folders 0700, files 0600); true: written with "
        "your umask (e.g. group-readable).",
    )
    memory_check: bool = option(
        True, "Refuse a run whose estimated peak memory of one step exceeds the free memory, before the model loads."
    )
    export_every_n_steps: int = option(
        0, "Also write the policy to <output_dir>/hf/step_N every n steps; 0: only <output_dir>/hf/final."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        if self.strategy == "deepspeed":
            problems.append(
                f"{p}strategy=deepspeed is not supported: ZeRO partitions the gradients that the NaN guard and "
                "gradient clipping read, and steps the optimizer itself; use trainer.strategy=fsdp to shard weights, "
                "gradients and optimizer state"
            )
        else:
            choice(problems, f"{p}strategy", self.strategy, STRATEGIES)
        choice(problems, f"{p}accelerator", self.accelerator, ACCELERATORS)
        choice(problems, f"{p}precision", str(self.precision), PRECISIONS)
        check(problems, self.devices >= 1 or self.devices == -1, f"{p}devices={self.devices} must be >= 1 (-1 = all)")
        check(problems, self.num_nodes >= 1, f"{p}num_nodes={self.num_nodes} must be >= 1")
        check(problems, self.num_threads >= 0, f"{p}num_threads={self.num_threads} must be >= 0 (0 = torch's default)")
        check(
            problems,
            not Path(self.output_dir).is_file(),
            f"{p}output_dir={self.output_dir!r} is a file; give a folder (it is created if missing)",
        )
        check(problems, self.max_steps >= 1, f"{p}max_steps={self.max_steps} must be >= 1")
        check(
            problems,
            self.checkpoint_every_n_steps >= 0,
            f"{p}checkpoint_every_n_steps={self.checkpoint_every_n_steps} must be >= 0 (0 = off)",
        )
        given = self.resume not in (None, "auto")
        check(
            problems,
            not given or Path(self.resume).is_file(),
            f"{p}resume={self.resume!r}: no such checkpoint file; give a .ckpt path, auto (the newest under "
            f"<trainer.output_dir>/checkpoints/) or null",
        )
        check(
            problems,
            not given or not Path(self.resume).is_file() or zipfile.is_zipfile(self.resume),
            f"{p}resume={self.resume!r} is not a checkpoint (torch.save writes a zip archive; this file is not "
            f"one): give a .ckpt written by a run, auto or null",
        )
        check(problems, self.keep_checkpoints >= 1, f"{p}keep_checkpoints={self.keep_checkpoints} must be >= 1")
        check(
            problems,
            self.export_every_n_steps >= 0,
            f"{p}export_every_n_steps={self.export_every_n_steps} must be >= 0 (0 = only hf/final)",
        )
        check(
            problems,
            self.malloc_mmap_threshold >= 0,
            f"{p}malloc_mmap_threshold={self.malloc_mmap_threshold} must be >= 0 bytes (0 keeps glibc's own "
            "threshold; e.g. 131072)",
        )
        return problems
