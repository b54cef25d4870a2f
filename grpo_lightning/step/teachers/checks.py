"""The teacher checked at start-up, before any weights load: the same tokenizer as the student's
(the first difference named), a context that holds the longest prompt it sees plus the completion,
prompts it can re-format (context distillation), and for a vision-language student a teacher that sees
its images (models/teacher.py). Each failure is one ConfigError line."""

from __future__ import annotations

from lightning.pytorch.utilities import rank_zero_warn

from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.data.vision_prompting import VisionPrompts
from grpo_lightning.errors import ConfigError, ServerError
from grpo_lightning.models.loading import load_tokenizer
from grpo_lightning.models.teacher import check_context, check_teacher_kind, check_tokenizers, load_teacher_tokenizer
from grpo_lightning.models.vision.loading import vision_model_type
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.step.teachers.context import system_swap, teacher_formatter
from grpo_lightning.step.teachers.server import teacher_client


def _longest(records: list[dict], formatter: PromptFormatter, prefix: str = "") -> int:
    lengths = (len(formatter.untruncated(prefix + r["prompt"] if prefix else r["prompt"])) for r in records)
    return max(lengths, default=0)


def _server_probe(cfg, tokenizer, text: str) -> int | None:
    """Without a teacher folder: the server's own tokenizer on ``text`` (vLLM's ``/tokenize``) against the
    student's, and the server's context (``max_model_len``); a server without that route is not checked."""
    s = cfg.algorithm.teacher.server
    client = teacher_client(cfg, min(s.timeout_s, 30.0))
    try:
        body = {"model": client.served_model(), "prompt": text, "add_special_tokens": False}
        answer = client.call("POST", "/tokenize", "a tokenizer probe", json=body)
    except ServerError as err:
        rank_zero_warn(
            f"algorithm.teacher.server: the teacher's tokenizer was not checked ({err}); set algorithm.teacher.path to its folder to check it"
        )
        return None
    finally:
        client.close()
    ours = tokenizer(text, add_special_tokens=False)["input_ids"]
    theirs = list(answer.get("tokens", []))
    if theirs != ours:
        at = next(
            (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
        )
        raise ConfigError(
            f"the teacher server ({s.url}) tokenizes a training prompt otherwise than the student (model.name_or_path="
            f"{cfg.model.name_or_path!r}): token {at} is {ours[at] if at < len(ours) else None} for the student and "
            f"{theirs[at] if at < len(theirs) else None} for the teacher; the teacher scores the student's token ids, so "
            "both need one tokenizer (cross-tokenizer distillation is not supported)"
        )
    return answer.get("max_model_len")


def check_teacher(cfg, records: list[dict], loaded: tuple | None = None) -> None:
    """Every start-up check of the module doc for ``cfg.algorithm.teacher`` on the training ``records``;
    ``loaded``: the student's (tokenizer, context) when given as objects."""
    t = cfg.algorithm.teacher
    if not t.active or not records:
        return
    kind = t.resolved_kind()
    student_type = vision_model_type(cfg.model)
    tokenizer, context = loaded if loaded is not None else load_tokenizer(cfg.model)
    name = f"model.name_or_path={cfg.model.name_or_path!r}"
    if kind == "server" and student_type is not None:
        raise ConfigError(
            f"algorithm.teacher.kind=server with a vision-language policy ({name}): the server is sent token ids "
            "only, without the images; use a local teacher (algorithm.teacher.path=<a vision-language folder of the "
            "student's family>, kind=base with LoRA, or kind=context)"
        )
    if t.path is not None and kind != "server":
        check_teacher_kind(student_type, processor_of(tokenizer), t.path, name)
    if student_type is not None:
        check_vision_teacher(cfg, records, tokenizer, context, kind, name)
        return
    task = cfg.task
    formatter = PromptFormatter(tokenizer, task.system_prompt, task.instruction, use_chat_template=task.chat_template)
    longest = _longest(records, formatter) if kind != "context" else 0
    if kind == "context":
        if not isinstance(records[0]["prompt"], str):
            raise ConfigError(
                "algorithm.teacher.kind=context re-formats each question with the teacher's prompt, and the task's prompts "
                "are chat messages; give the prompts as text (the system prompt and few-shot examples go in "
                "algorithm.teacher.context.*)"
            )
        their_formatter, prefix = teacher_formatter(cfg, tokenizer)
        longest, name = _longest(records, their_formatter, prefix), "the policy with algorithm.teacher.context's prompt"
    elif t.path is not None:
        teacher_tokenizer, context = load_teacher_tokenizer(t.path)
        student = name
        name = f"algorithm.teacher.path={t.path!r}"
        check_tokenizers(tokenizer, teacher_tokenizer, student, name)
    elif kind == "server":
        context, name = (
            _server_probe(cfg, tokenizer, formatter.text(records[0]["prompt"])),
            f"the server {t.server.url}",
        )
    check_context(context, longest, cfg.rollout.max_new_tokens, name)


def check_vision_teacher(cfg, records: list[dict], tokenizer, context: int | None, kind: str, name: str) -> None:
    """A vision-language student's teacher (a folder of its family and processor: checked already): its
    tokenizer, and a context that holds the longest prompt it sees, images included, plus the completion."""
    t, extra, student_context = cfg.algorithm.teacher, 0, context
    if kind == "context":
        swap = system_swap(cfg, tokenizer)
        swap.check()
        extra, name = swap.extra_tokens, "the policy with algorithm.teacher.context's system prompt"
    elif t.path is not None:
        teacher_tokenizer, context = load_teacher_tokenizer(t.path)
        check_tokenizers(tokenizer, teacher_tokenizer, name, f"algorithm.teacher.path={t.path!r}")
        name = f"algorithm.teacher.path={t.path!r}"
    # The student's own prompts were checked against its context (data/image_checks.py): measured again
    # (the images processed) only when the teacher's context is shorter or its prompt longer.
    if context is None or (student_context is not None and context >= student_context + extra):
        return
    prompts = VisionPrompts(processor_of(tokenizer), cfg.task.system_prompt, max_prompts=1)
    longest = max((len(prompts(r)[0]) for r in records), default=0) + extra
    check_context(context, longest, cfg.rollout.max_new_tokens, name)
