"""``algorithm.teacher.*``: on-policy distillation's teacher (docs/distillation.md).

With no teacher (``kind`` none, or auto without ``path``) nothing changes. The teacher scores the
student's own sampled tokens; the registered objective (``objective``, options
``algorithm.teacher.<objective>.*``) turns that into a per-token advantage beside the reward
advantages or a divergence added to the loss, with ``weight`` as its share.

A teacher kind is registered by name in :data:`TEACHER_KINDS` with its options dataclass (the node
``algorithm.teacher.<kind>.*``) and its implementation, a class or a ``"module:Class"`` path
imported only when a run builds it (the CLI validates the config before any heavy import). The
built-in kinds are declared here, their code lives in ``grpo_lightning/step/teachers/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from grpo_lightning.config.base import Schema, check, choice, option
from grpo_lightning.config.nodes import PluginNodes
from grpo_lightning.registry import Registry

TEACHER_DTYPES = ("auto", "float32", "bfloat16", "float16")
# kind -> the teacher's class, or "module:Class" (resolved by grpo_lightning.step.teachers.teacher_class)
TEACHER_KINDS: Registry[object] = Registry("teacher kind", "algorithm.teacher.kind")


def register_teacher_kind(name: str, implementation: object, options: type | None = None) -> object:
    """``algorithm.teacher.kind=name`` builds ``implementation`` (a class or ``"module:Class"``);
    its ``options`` dataclass becomes ``algorithm.teacher.<name>.*``."""
    return TEACHER_KINDS.add(name, implementation, options=options)


@dataclass
class ContextTeacherOptions(Schema):
    """Context distillation: the frozen initial policy, shown a prompt the student does not see."""

    system_prompt: Optional[str] = option(
        None, "The teacher's system prompt (with a chat template), in place of task.system_prompt; null: the task's."
    )
    prefix: str = option("", "Text put before every question the teacher sees: few-shot examples, hints.")
    prefix_file: Optional[str] = option(
        None, "A UTF-8 file whose text is the prefix (long few-shot blocks); with prefix empty."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        file = None if self.prefix_file is None else Path(self.prefix_file).expanduser()
        check(
            problems,
            file is None or file.is_file(),
            f"{p}prefix_file={self.prefix_file!r}: no such file; give a UTF-8 text file, or the text in {p}prefix",
        )
        check(
            problems,
            file is None or not self.prefix,
            f"{p}prefix and {p}prefix_file are both set; keep one",
        )
        return problems

    def prefix_text(self) -> str:
        if self.prefix_file is not None:
            return Path(self.prefix_file).expanduser().read_text(encoding="utf-8")
        return self.prefix


@dataclass
class ServerTeacherOptions(Schema):
    """A teacher behind a vLLM server that returns prompt log-probs (scale-out)."""

    url: Optional[str] = option(
        None, "The teacher server's base URL (http://host:port), serving the teacher's weights."
    )
    timeout_s: float = option(300.0, "Seconds one scoring request may take before the run stops with the server named.")
    concurrency: int = option(8, "Scoring requests in flight at once (one sequence each).")
    api_key_env: Optional[str] = option(None, "Environment variable holding the server's API key; null: none.")

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(problems, self.timeout_s > 0, f"{p}timeout_s={self.timeout_s} must be > 0")
        check(problems, self.concurrency >= 1, f"{p}concurrency={self.concurrency} must be >= 1")
        url = self.url or ""
        check(
            problems,
            self.url is None or url.startswith(("http://", "https://")),
            f"{p}url={self.url!r} must start with http:// or https://",
        )
        return problems


register_teacher_kind("folder", "grpo_lightning.step.teachers.folder:FolderTeacher")
register_teacher_kind("base", "grpo_lightning.step.teachers.base:LoraBaseTeacher")
register_teacher_kind("context", "grpo_lightning.step.teachers.context:ContextTeacher", options=ContextTeacherOptions)
register_teacher_kind("server", "grpo_lightning.step.teachers.server:ServerTeacher", options=ServerTeacherOptions)


@dataclass
class TeacherConfig(PluginNodes):
    """The teacher, and one node per registered objective or kind with options
    (``algorithm.teacher.jsd.beta``, ``algorithm.teacher.context.prefix``)."""

    node_registries = ("grpo_lightning.algorithm.distillation:TEACHER_OBJECTIVES", TEACHER_KINDS)

    kind: str = option(
        "auto",
        "none, folder (path), base (a LoRA policy's base, adapters off), context (the initial policy, another prompt), server; auto: folder with a path.",
    )
    path: Optional[str] = option(
        None,
        "The teacher's local Hugging Face folder (kind folder; kind server: the served model's, for its tokenizer).",
    )
    weight: float = option(
        1.0,
        "The teacher term's share: A = A_reward + weight x A_teacher (or + weight x divergence); reward weights 0: pure distillation.",
    )
    objective: str = option(
        "reverse_kl",
        "Registered objective: reverse_kl (sampled tokens, an advantage) or jsd (full distributions, local teachers).",
    )
    dtype: str = option(
        "auto", f"Dtype the teacher's folder loads in, one of {TEACHER_DTYPES} (auto: its checkpoint's own)."
    )
    device: str = option(
        "auto", "Where a local teacher runs: auto (the policy's device) or a torch device (cpu, cuda:1)."
    )
    agreement: bool = option(
        True,
        "Log distill/argmax_agreement (teacher and student argmax agree): one more head pass of each model per step.",
    )

    def resolved_kind(self) -> str:
        """The kind in effect: auto is folder when a path is given, none otherwise."""
        if self.kind == "auto":
            return "folder" if self.path else "none"
        return self.kind

    @property
    def active(self) -> bool:
        return self.resolved_kind() != "none"

    def check_fields(self, p: str) -> list[str]:
        from grpo_lightning.algorithm.distillation import TEACHER_OBJECTIVES  # noqa: PLC0415  (torch: only when names are checked)

        # value_problems are AlgorithmConfig.value_problems' (the CLI's early check runs them too)
        problems: list[str] = []
        if (problem := TEACHER_OBJECTIVES.problem(self.objective, f"{p}objective")) is not None:
            problems.append(problem)
        elif TEACHER_OBJECTIVES[self.objective].full_distribution and self.resolved_kind() == "server":
            problems.append(
                f"{p}objective={self.objective} needs the teacher's whole distribution at every position, and a vLLM "
                f"server returns the log-probs of the sampled tokens only: use {p}objective=reverse_kl with "
                f"{p}kind=server, or a local teacher ({p}kind=folder, base or context)"
            )
        if self.resolved_kind() == "server" and not self.server.url:
            problems.append(f"{p}kind=server needs {p}server.url=http://host:port (a vLLM server serving the teacher)")
        return problems

    def value_problems(self, p: str) -> list[str]:
        """The rules that need no registry of torch code (what the CLI checks before heavy imports)."""
        problems: list[str] = []
        kind = self.resolved_kind()
        if kind != "none" and (problem := TEACHER_KINDS.problem(kind, f"{p}kind")) is not None:
            problems.append(problem)
        choice(problems, f"{p}dtype", self.dtype, TEACHER_DTYPES)
        check(
            problems,
            self.weight >= 0,
            f"{p}weight={self.weight} must be >= 0 (0: the teacher is scored, not learned from)",
        )
        if self.path is not None:
            folder = Path(self.path).expanduser()
            check(
                problems,
                folder.is_dir() and (folder / "config.json").is_file(),
                f"{p}path={self.path!r}: "
                + ("no such folder" if not folder.exists() else "not a model folder (it has no config.json)")
                + "; give the teacher's local Hugging Face folder (config.json, weights, tokenizer)",
            )
        check(
            problems,
            kind != "folder" or self.path is not None,
            f"{p}kind=folder needs {p}path=<the teacher's local Hugging Face folder>",
        )
        check(
            problems,
            self.device == "auto" or kind == "folder",
            f"{p}device={self.device!r} applies to a teacher folder only ({p}kind={kind} runs on the policy's "
            f"weights or device); set {p}device=auto",
        )
        return problems


def teacher_problems(cfg) -> list[str]:
    """The teacher's rules that span groups (``cfg`` a TrainConfig): what the teacher needs of the
    rollout, the rewards and the model."""
    t = cfg.algorithm.teacher
    if not t.active:
        return []
    p, problems = "algorithm.teacher.", []
    kind, r = t.resolved_kind(), cfg.rollout
    pure = bool(cfg.task.rewards) and all(float(w) == 0.0 for w in cfg.task.rewards.values())
    check(
        problems,
        kind != "server" or r.temperature == 1.0,
        f"{p}kind=server with rollout.temperature={r.temperature}: vLLM returns prompt log-probs of the raw logits "
        "(no temperature), so the teacher would score at 1 while the student samples at another; set "
        "rollout.temperature=1.0, or use a local teacher (it scores at the sampling temperature)",
    )
    check(
        problems,
        not (pure and r.dynamic_sampling),
        "rollout.dynamic_sampling=true with every task.rewards weight 0 (pure distillation): every group's reward is "
        "tied, so dynamic sampling would drop every group; the teacher's per-token signal needs no reward spread: set "
        "rollout.dynamic_sampling=false (or give a reward a weight)",
    )
    check(
        problems,
        not (pure and t.weight == 0),
        f"{p}weight=0 with every task.rewards weight 0: nothing to learn from; give the teacher a weight > 0",
    )
    lora = cfg.model.lora.rank > 0 or cfg.model.lora.config_file is not None
    check(
        problems,
        kind != "base" or lora,
        f"{p}kind=base is a LoRA policy's base model (adapters off), but model.lora is off; set model.lora.rank, "
        f"or use {p}kind=folder with {p}path",
    )
    return problems
