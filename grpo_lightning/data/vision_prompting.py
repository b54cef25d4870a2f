"""A row with images -> the prompt's token ids and its :class:`~grpo_lightning.records.VisionInputs`.

As TRL's GRPOTrainer: a prompt with images must be chat messages; where its messages hold no
``{"type": "image"}`` part, one per image goes before the text of the first user message (TRL's
``prepare_multimodal_messages``). The processor renders the chat template, expands every image
into its run of image tokens and makes the image tensors, once per distinct prompt: the G
samples of a group share the result, and a prompt seen again reuses it. The new prompts of a step
go through the processor in one call, split back per prompt (exactly what one call each makes).
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict

import torch

from grpo_lightning.data.images import image_hash, image_refs, load_image, ref_key, ref_name
from grpo_lightning.records import VisionInputs

# Processor outputs that are not image tensors (the ids are the prompt; the rest are rebuilt per pass).
TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")


def image_parts(prompt) -> int:
    """How many ``{"type": "image"}`` parts a chat prompt holds (0 for a string)."""
    if isinstance(prompt, str):
        return 0
    return sum(
        1
        for m in prompt
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    )


def with_image_parts(messages: list[dict], count: int) -> list[dict]:
    """Messages with structured contents; ``count`` image parts before the first user message's text when
    they have none (TRL's rule). Image parts carry no payload: the images go to the processor in order."""
    place = image_parts(messages) == 0 and count > 0
    out = []
    for message in messages:
        content = message.get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        parts = [{"type": p["type"], **({"text": p["text"]} if p.get("type") == "text" else {})} for p in parts]
        if place and message.get("role") == "user":
            parts = [{"type": "image"} for _ in range(count)] + parts
            place = False
        out.append({**message, "content": parts})
    return out


class VisionPrompts:
    """Prompt rows -> (ids, images) with ``processor``; ``system_prompt`` as the text formatter adds it."""

    def __init__(self, processor, system_prompt: str | None = None, max_prompts: int = 4096):
        self.processor = processor
        self.system_prompt = system_prompt
        self.image_token_id = int(processor.tokenizer.convert_tokens_to_ids(_image_token(processor)))
        self.max_prompts = max_prompts
        self._done: OrderedDict[tuple, tuple[list[int], VisionInputs | None]] = OrderedDict()

    def messages(self, prompt, count: int) -> list[dict]:
        if isinstance(prompt, str):
            raise ValueError(
                "a prompt with images must be chat messages [{'role': 'user', 'content': ...}] (as TRL requires "
                "for multimodal training), not a plain string"
            )
        messages = with_image_parts(list(prompt), count)
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": [{"type": "text", "text": self.system_prompt}]}, *messages]
        return messages

    def __call__(self, record: dict) -> tuple[list[int], VisionInputs | None]:
        return self.many([record])[0]

    def many(self, records: list[dict]) -> list[tuple[list[int], VisionInputs | None]]:
        """``self(record)`` of each record; the prompts not seen before that carry images go through the
        processor in one call (its per-call overhead paid once, the pictures resized together), the
        same ids and tensors as one call each (tests/unit/data/test_images.py)."""
        keys = [self._key(r) for r in records]
        new: dict[tuple, tuple[str, list, list]] = {}
        found: dict[tuple, tuple[list[int], VisionInputs | None]] = {}
        for key, record in zip(keys, records, strict=True):
            if key in self._done:
                self._done.move_to_end(key)
                found[key] = self._done[key]
            elif key not in new:
                new[key] = self._text(record)
        batched = {k: v for k, v in new.items() if v[1]} if len(new) > 1 else {}
        for key, prompt in new.items():
            if key not in batched:
                found[key] = self._process_one(key, *prompt)
        if batched:
            found.update(self._process_together(batched))
        return [found[key] for key in keys]

    def _key(self, record: dict) -> tuple:
        return (_prompt_key(record["prompt"]), tuple(ref_key(r) for r in image_refs(record)))

    def _text(self, record: dict) -> tuple[str, list, list]:
        """The record's prompt rendered by the chat template, its images loaded, and their refs."""
        refs = image_refs(record)
        images = [load_image(r) for r in refs]
        prompt = record["prompt"]
        if isinstance(prompt, str) and not images:  # a text-only row: one user message, as the text formatter
            prompt = [{"role": "user", "content": prompt}]
        messages = self.messages(prompt, len(images))
        # The template holds every special token: none added (as the text formatter tokenizes it).
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), images, refs

    def _process_together(self, batched: dict[tuple, tuple[str, list, list]]) -> dict[tuple, tuple]:
        """One processor call for ``batched``'s prompts (each with images), split back per prompt; one call
        each where the image tensors' layout is not one this splits (see :func:`_per_image_rows`)."""
        texts = [text for text, _, _ in batched.values()]
        images = [image for _, pictures, _ in batched.values() for image in pictures]
        # The ids unpadded as lists (no pad token to strip, none to count as an image or video token).
        out = self.processor(
            text=texts, images=images, images_kwargs={"return_tensors": "pt"}, add_special_tokens=False
        )
        tensors, counts = _image_tensors(out), [len(pictures) for _, pictures, _ in batched.values()]
        rows = _per_image_rows(tensors, len(images)) if len(tensors) == len(out.keys() - set(TEXT_KEYS)) else None
        if rows is None:
            return {key: self._process_one(key, *prompt) for key, prompt in batched.items()}
        done, first = {}, 0
        for index, (key, (_, pictures, refs)) in enumerate(batched.items()):
            ids = list(out["input_ids"][index])
            own = {}
            for name, tensor in tensors.items():
                starts = rows[name]
                own[name] = tensor[starts[first] : starts[first + counts[index]]].clone()
            done[key] = self._keep(key, pictures, refs, ids, own)
            first += counts[index]
        return done

    def _process_one(self, key: tuple, text: str, images: list, refs: list) -> tuple:
        """One prompt through the processor on its own, kept."""
        out = self.processor(text=[text], images=images or None, return_tensors="pt", add_special_tokens=False)
        return self._keep(key, images, refs, out["input_ids"][0].tolist(), _image_tensors(out))

    def _keep(self, key: tuple, images: list, refs: list, ids: list[int], tensors: dict) -> tuple:
        """The prompt's (ids, images), kept for the next time it comes (the oldest prompts dropped)."""
        vision = None
        if images:
            vision = VisionInputs(
                key="|".join(image_hash(i) for i in images),
                refs=[ref_name(r, i) for r, i in zip(refs, images, strict=True)],
                tensors=tensors,
                num_image_tokens=sum(1 for t in ids if t == self.image_token_id),
                images=images,
            )
        self._done[key] = (ids, vision)
        while len(self._done) > self.max_prompts:
            self._done.popitem(last=False)
        return ids, vision


def _image_tensors(out) -> dict[str, torch.Tensor]:
    return {k: v for k, v in out.items() if k not in TEXT_KEYS and isinstance(v, torch.Tensor)}


def _per_image_rows(tensors: dict[str, torch.Tensor], images: int) -> dict[str, list[int]] | None:
    """Where each image's rows start in each tensor of a batched processor call (and where the last ends):
    one row per image, or Qwen2-VL's patches (``image_grid_thw``'s product per image) for ``pixel_values``;
    None for any other layout."""
    grid = tensors.get("image_grid_thw")
    per_image = [1] * images
    out = {}
    for name, tensor in tensors.items():
        sizes = grid.prod(dim=-1).tolist() if name == "pixel_values" and grid is not None else per_image
        if tensor.dim() == 0 or tensor.shape[0] != sum(sizes):
            return None
        out[name] = [0, *itertools.accumulate(sizes)]
    return out


def display_text(tokenizer, ids: list[int], vision: VisionInputs | None, image_token_id: int) -> str:
    """The prompt as text with each image's run of image tokens shown as ``<image:HASH>``: readable in tables,
    and part of the prompt's identity (one question over two pictures is two prompts)."""
    hashes = vision.key.split("|") if vision is not None else []
    pieces, text, index, previous = [], [], 0, None
    for token in ids:
        if token == image_token_id:
            if previous != image_token_id:
                pieces.append(tokenizer.decode(text))
                text = []
                pieces.append(f"<image:{hashes[index] if index < len(hashes) else '?'}>")
                index += 1
        else:
            text.append(token)
        previous = token
    pieces.append(tokenizer.decode(text))
    return "".join(pieces)


def _image_token(processor) -> str:
    token = getattr(processor, "image_token", None) or getattr(processor.tokenizer, "image_token", None)
    if token is None:
        raise ValueError(f"{type(processor).__name__} names no image token (processor.image_token)")
    return token


def _prompt_key(prompt) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
