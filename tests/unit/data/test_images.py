"""Images as rows carry them (paths, bytes, PIL, data URIs, a datasets Image feature), their identity,
TRL's placement of image parts, and a prompt's identity including its images."""

from __future__ import annotations

import base64
import io
import random

import pytest
import torch
from helpers.vision import FAMILIES, random_image, random_records
from PIL import Image

from grpo_lightning.config import ModelConfig
from grpo_lightning.data.images import image_hash, image_refs, load_image, ref_key, ref_name, resolve_paths
from grpo_lightning.data.vision_prompting import VisionPrompts, display_text, image_parts, with_image_parts
from grpo_lightning.health.fingerprints import TextHashes
from grpo_lightning.models.loading import load_tokenizer
from grpo_lightning.models.vision.loading import TINY_VLM
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.rollout.dynamic_sampling import record_key


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_form_of_an_image_loads_to_the_same_pixels(tmp_path):
    rng = random.Random(0)
    for index in range(20):
        image = random_image(rng)
        data = png(image)
        path = tmp_path / f"{index}.png"
        path.write_bytes(data)
        forms = [
            image,
            data,
            str(path),
            {"bytes": data, "path": None},
            {"bytes": None, "path": str(path)},
            "data:image/png;base64," + base64.b64encode(data).decode(),
            image.convert("RGBA"),
        ]
        hashes = {image_hash(load_image(form)) for form in forms}
        assert hashes == {image_hash(image)}, index
        assert ref_name(str(path), image) == str(path) and ref_name(data, image).startswith("sha:")


def test_relative_paths_are_read_from_the_data_files_folder(tmp_path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "a.png").write_bytes(png(Image.new("RGB", (4, 4))))
    records = [{"prompt": "x", "image": "pics/a.png"}, {"prompt": "y", "images": ["pics/a.png", "pics/missing.png"]}]
    resolve_paths(records, tmp_path)
    assert records[0]["image"] == str(tmp_path / "pics" / "a.png")
    assert records[1]["images"] == [str(tmp_path / "pics" / "a.png"), "pics/missing.png"]  # left for the check
    assert image_refs(records[0]) == [records[0]["image"]] and len(image_refs(records[1])) == 2
    assert image_refs({"prompt": "z"}) == []


def test_image_parts_go_before_the_first_user_text_as_in_trl():
    """Property: the count of parts equals the images; given parts are kept in place; texts survive."""
    rng = random.Random(0)
    for _ in range(200):
        count = rng.randint(0, 3)
        messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}]
        if rng.random() < 0.5:
            messages.append({"role": "user", "content": "q2"})
        out = with_image_parts(messages, count)
        assert image_parts(out) == count
        user = next(m for m in out if m["role"] == "user")
        assert [p["type"] for p in user["content"]] == ["image"] * count + ["text"]
        assert [p.get("text") for m in out for p in m["content"] if p["type"] == "text"] == [
            m["content"] for m in messages
        ]
        explicit = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}]}]
        assert with_image_parts(explicit, 1)[0]["content"] == explicit[0]["content"]


@pytest.fixture(scope="module")
def prompts():
    tokenizer, _ = load_tokenizer(ModelConfig(name_or_path=TINY_VLM))
    return VisionPrompts(processor_of(tokenizer))


def test_a_prompts_identity_includes_its_images(prompts):
    """One question over two pictures is two prompts: in the text fingerprints, tables and dynamic sampling."""
    rng = random.Random(0)
    question = [{"role": "user", "content": "what is it?"}]
    first, second = random_image(rng), random_image(rng)
    a, b = {"prompt": question, "images": [first]}, {"prompt": question, "images": [second]}
    same = {"prompt": question, "images": [first.copy()]}
    texts = []
    for record in (a, b, same):
        ids, vision = prompts(record)
        texts.append(display_text(prompts.processor.tokenizer, ids, vision, prompts.image_token_id))
    assert texts[0] != texts[1] and texts[0] == texts[2]  # the same pixels: the same prompt
    assert f"<image:{image_hash(first)}>" in texts[0] and "<|image_pad|>" not in texts[0]
    hashes = TextHashes()(texts)
    assert hashes[0] != hashes[1] and hashes[0] == hashes[2]
    assert record_key(a) != record_key(b) and record_key(a) == record_key(dict(a))


class CountedProcessor:
    """A processor that counts its calls (everything else is the processor's own)."""

    def __init__(self, processor):
        self.processor, self.calls = processor, 0

    def __getattr__(self, name):
        return getattr(self.processor, name)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.processor(*args, **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_new_prompts_processed_in_one_call_equal_one_call_each(family, tiny_vlm_folders):
    """A step's new prompts go through the processor together; each gets exactly the ids and tensors (pixels of
    pictures of random sizes, Qwen2-VL's patches and grids) that a call of its own makes."""
    tokenizer, _ = load_tokenizer(ModelConfig(name_or_path=tiny_vlm_folders[family]))
    counted = CountedProcessor(processor_of(tokenizer))
    together, alone = VisionPrompts(counted), VisionPrompts(processor_of(tokenizer))
    records = random_records(random.Random(f"together-{family}"), 5)
    together(records[0])  # seen before: from the cache
    counted.calls = 0
    got = together.many([*records, records[1]])  # a prompt twice (a repeated row): one processing
    assert counted.calls == 1
    assert got[5][1] is got[1][1] and got[0][1] is together(records[0])[1]
    for (ids, vision), record in zip(got, [*records, records[1]], strict=True):
        want_ids, want = alone(record)
        assert ids == want_ids and vision.key == want.key and vision.refs == want.refs
        assert vision.num_image_tokens == want.num_image_tokens and vision.tensors.keys() == want.tensors.keys()
        for name, tensor in want.tensors.items():
            assert torch.equal(vision.tensors[name], tensor), name


def test_a_groups_samples_share_one_processing_of_their_prompt(prompts):
    records = random_records(random.Random(3), 4)
    for record in records:
        ids, vision = prompts(record)
        assert prompts(record)[1] is vision  # cached: computed once
        assert vision.num_image_tokens == sum(1 for t in ids if t == prompts.image_token_id)
        assert vision.num_images == len(record["images"])
    assert ref_key(records[0]["images"][0]) == ref_key(records[0]["images"][0])
