"""A distillation teacher's files: its weights in any dtype, and the start-up checks that it can
score the student's tokens (the same tokenizer, a context that holds the rollout).

The teacher scores the student's exact token ids, so both must share one tokenizer: the same
vocabulary (every token with the same id) and the same special tokens. A difference is named, the
first one found, before any weights load; a teacher of another tokenizer is refused (cross-tokenizer
distillation would need the text re-tokenised and the two sequences aligned, which this trainer
does not do).

A vision-language student's teacher folder is a vision-language model of its family with the same
processor (every image becomes as many image tokens, in the same place): its tower sees the student's
images. A text teacher of a VLM student, a VLM teacher of a text student, another family or another
image processor are each refused in one line (:func:`check_teacher_kind`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.loading import torch_dtype
from grpo_lightning.models.vision import compat, family_of, is_vision_config

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token")


def _folder(path: str) -> str:
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"algorithm.teacher.path={path!r}: "
            + ("no such folder" if not folder.exists() else "not a model folder (it has no config.json)")
            + "; give the teacher's local Hugging Face folder (config.json, weights, tokenizer)"
        )
    return str(folder)


def load_teacher_tokenizer(path: str) -> tuple[PreTrainedTokenizerBase, int | None]:
    """The teacher folder's tokenizer and context length (``max_position_embeddings``), no weights."""
    folder = _folder(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        config = AutoConfig.from_pretrained(folder)
        context = getattr(getattr(config, "text_config", None) or config, "max_position_embeddings", None)
    except OSError as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"algorithm.teacher.path={path!r}: cannot load its tokenizer: {first}") from err
    return tokenizer, context


def load_teacher_model(path: str, dtype: str) -> PreTrainedModel:
    """The teacher's weights in ``dtype`` (auto: the checkpoint's own), frozen, in eval mode (a
    vision-language folder as one: its tower sees the student's images)."""
    folder = _folder(path)
    vision = is_vision_config(AutoConfig.from_pretrained(folder))
    if vision:
        compat.apply()  # without torchvision (models/vision/compat.py)
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = auto.from_pretrained(folder, dtype=torch_dtype(dtype))
    return model.requires_grad_(False).eval()


def _by_id(vocab: dict[str, int]) -> list[tuple[int, str]]:
    return sorted((i, token) for token, i in vocab.items())


def tokenizer_difference(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> str | None:
    """The first difference between two tokenizers in what scoring the student's ids depends on:
    a token's id (in id order), a token one of them lacks, a special token; None when they agree."""
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    for i, token in _by_id(s_vocab):
        if t_vocab.get(token) != i:
            where = "has no such token" if token not in t_vocab else f"has it as id {t_vocab[token]}"
            return f"the student's token {token!r} is id {i}, the teacher {where}"
    for i, token in _by_id(t_vocab):
        if token not in s_vocab:
            return f"the teacher's token {token!r} (id {i}) is not in the student's vocabulary"
    for name in SPECIAL_TOKENS:
        s_token, t_token = getattr(student, name, None), getattr(teacher, name, None)
        if s_token != t_token:
            return f"the {name} differs: {s_token!r} for the student, {t_token!r} for the teacher"
    s_special, t_special = set(student.all_special_tokens), set(teacher.all_special_tokens)
    if s_special != t_special:
        token = sorted(s_special ^ t_special)[0]
        side = "student" if token in s_special else "teacher"
        return f"{token!r} is a special token of the {side}'s tokenizer only"
    return None


def check_tokenizers(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, student_name: str, teacher_name: str
) -> None:
    """ConfigError naming the first difference (see the module doc), or nothing."""
    difference = tokenizer_difference(student, teacher)
    if difference is not None:
        raise ConfigError(
            f"the teacher's tokenizer ({teacher_name}) is not the student's ({student_name}): {difference}; the teacher "
            "scores the student's token ids, so both need one tokenizer (cross-tokenizer distillation is not supported): "
            "use a teacher of the student's family"
        )


def check_context(context: int | None, longest_prompt: int, max_new_tokens: int, teacher_name: str) -> None:
    """ConfigError when the teacher's context cannot hold the longest prompt it sees plus the completion."""
    needed = longest_prompt + max_new_tokens
    if context is not None and context < needed:
        raise ConfigError(
            f"the teacher's context is {context} tokens ({teacher_name}), shorter than the rollout it must score: "
            f"{longest_prompt} prompt tokens (the longest it sees) + rollout.max_new_tokens={max_new_tokens} = {needed}; "
            "use a teacher with a longer context, shorter prompts, or a lower rollout.max_new_tokens"
        )


def head_size(model: torch.nn.Module) -> int | None:
    """Rows of the model's output head (the vocabulary it scores), or None without a plain head."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return head.weight.shape[0] if head is not None and hasattr(head, "weight") else None


def _flat(d: dict, at: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{at}{key}."))
        else:
            out[f"{at}{key}"] = value
    return out


def processor_difference(student, teacher) -> str | None:
    """The first difference between two VLM processors in what makes a prompt's image tokens and pixels
    (the image processor, the patch size, ...: ``to_dict``, which leaves the tokenizer out); None: none."""
    ours, theirs = _flat(student.to_dict()), _flat(teacher.to_dict())
    for key in sorted(set(ours) | set(theirs)):
        if key.endswith(("processor_class", "image_processor_type")) or ours.get(key) == theirs.get(key):
            continue
        return f"the processor's {key} is {ours.get(key)!r} for the student, {theirs.get(key)!r} for the teacher"
    return None


def check_teacher_kind(student_type: str | None, student_processor, path: str, student_name: str) -> None:
    """ConfigError when the teacher folder at ``path`` cannot see what the student sees: a text teacher for a
    vision-language student (``student_type``: its model type, None for a text one), a VLM teacher for a text
    student, a teacher of another VLM family or with another processor (the first difference named)."""
    config = AutoConfig.from_pretrained(_folder(path))
    name = f"algorithm.teacher.path={path!r}"
    if student_type is None:
        if is_vision_config(config):
            raise ConfigError(
                f"{name} is a vision-language model ({config.model_type}) and the student ({student_name}) is a text "
                "model: its prompts carry no images; use a text teacher of the student's tokenizer"
            )
        return
    if not is_vision_config(config):
        raise ConfigError(
            f"{name} is a text-only model ({config.model_type}) and the student ({student_name}) is a vision-language "
            f"model ({student_type}): the teacher would score the completions without the images; use a "
            f"vision-language teacher of the student's family, algorithm.teacher.kind=base (LoRA) or kind=context"
        )
    theirs, ours = family_of(config), family_of(SimpleNamespace(model_type=student_type))
    if theirs is not ours:
        raise ConfigError(
            f"{name} is a {config.model_type} model and the student ({student_name}) a {student_type}: another "
            "vision-language family turns images into other tokens and positions; use a teacher of the student's "
            "family, with its processor"
        )
    compat.apply()
    difference = processor_difference(student_processor, AutoProcessor.from_pretrained(_folder(path)))
    if difference is not None:
        raise ConfigError(
            f"the teacher's processor ({name}) is not the student's ({student_name}): {difference}; the teacher sees "
            "the student's pixels and image tokens, so both need one processor: use a teacher of the student's "
            "family saved with the student's processor"
        )
