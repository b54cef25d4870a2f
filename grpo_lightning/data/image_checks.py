"""Rows with images vetted before any model loads: each bad row is one line naming its source and row.

A missing file, bytes that are not an image, images for a model that takes none, a count of
``{"type": "image"}`` parts that is not the count of images, a prompt the processor cannot
expand, and a prompt too long for the context with its image tokens each stop the run here, not
minutes later in the first rollout (or silently: a prompt cut through its image tokens fails in
every pass). Only the processor runs (no weights).
"""

from __future__ import annotations

from collections.abc import Callable

from PIL import UnidentifiedImageError

from grpo_lightning.data.images import describe, image_refs, load_image
from grpo_lightning.data.vision_prompting import VisionPrompts, image_parts
from grpo_lightning.errors import DataError
from grpo_lightning.models.vision.processor import processor_of


def text_parts(prompt) -> list[str]:
    """The texts of a prompt: the string, or every message's string content and text parts."""
    if isinstance(prompt, str):
        return [prompt]
    texts = []
    for message in prompt:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    return texts


def has_images(record: dict) -> bool:
    return bool(image_refs(record)) or image_parts(record["prompt"]) > 0


def check_images(
    records: list[dict],
    source: str,
    tokenizer,
    max_prompt_tokens: int,
    model_name: str,
    bad_chars: Callable[[list[str]], list[str]] | None = None,
) -> None:
    """DataError for the first row with a bad image or image prompt (``bad_chars``: the characters of some
    texts the tokenizer cannot encode)."""
    processor = processor_of(tokenizer)
    prompts = VisionPrompts(processor, max_prompts=1) if processor is not None else None
    for row, record in enumerate(records):
        refs, prompt = image_refs(record), record["prompt"]
        if not refs and not image_parts(prompt):
            continue
        where = f"{source} row {row}"
        if prompts is None:
            raise DataError(
                f"{where} has {max(len(refs), image_parts(prompt))} image(s) but model.name_or_path={model_name!r} "
                "takes none (a text-only model); use a vision-language model (model=tiny_vlm, or the folder of "
                "one such as Qwen2-VL or LLaVA) or drop the images"
            )
        if isinstance(prompt, str):
            raise DataError(
                f"{where}: a prompt with images must be chat messages, not a string (as TRL requires); write "
                "it as [{'role': 'user', 'content': 'the question'}]: the images go before the question"
            )
        parts = image_parts(prompt)
        if parts != len(refs) and parts:
            raise DataError(
                f"{where}: {len(refs)} image(s) but the prompt has {parts} {{'type': 'image'}} part(s); give one "
                "part per image, or none (the images then go before the first user message's text, as in TRL)"
            )
        if not refs:
            raise DataError(f"{where}: the prompt has {parts} {{'type': 'image'}} part(s) but the row has no images")
        for index, ref in enumerate(refs):
            _load(ref, f"{where}: image {index} ({describe(ref)})")
        bad = bad_chars(text_parts(prompt)) if bad_chars is not None else []
        if bad:
            raise DataError(
                f"{where}: the tokenizer cannot encode the characters {bad} of the prompt's text; remove them "
                "from the data or use a model whose tokenizer has them"
            )
        try:
            ids, vision = prompts(record)
        except (ValueError, TypeError) as err:
            raise DataError(f"{where}: the processor cannot expand the prompt's images: {_first_line(err)}") from err
        if len(ids) > max_prompt_tokens:
            raise DataError(
                f"{where}: the prompt is {len(ids)} tokens ({vision.num_image_tokens} of them image tokens), more "
                f"than the model's context minus rollout.max_new_tokens ({max_prompt_tokens}); a prompt with "
                "images is never cut (a cut image fails every pass): use fewer or smaller images, a shorter "
                "question, or a lower rollout.max_new_tokens"
            )


def _load(ref, what: str) -> None:
    try:
        load_image(ref)
    except FileNotFoundError as err:
        raise DataError(
            f"{what}: no such file {str(err)!r} (a relative path is read from the data file's folder, then from "
            "the working folder)"
        ) from err
    except (UnidentifiedImageError, OSError, ValueError, TypeError) as err:
        raise DataError(f"{what} is not an image Pillow can read: {_first_line(err)}; fix or drop the row") from err


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
