"""The vLLM side of a vision-language policy without vLLM: each image's run of tokens collapsed to one
(vLLM expands it again), a server's request (the images as lossless data URLs, encoded once per prompt),
the plugin a launched server loads, the weight names vLLM's loader takes, and a frozen tower pushed once."""

from __future__ import annotations

import base64
import io
import json
import random
from importlib.metadata import distributions
from pathlib import Path

import numpy as np
import pytest
from helpers.vision import load_folder
from PIL import Image
from safetensors import safe_open

from grpo_lightning.config import VLLMConfig
from grpo_lightning.errors import ConfigError
from grpo_lightning.models.vision import compat
from grpo_lightning.records.vision import VisionInputs
from grpo_lightning.rollout import vllm_vision
from grpo_lightning.rollout.engine import EngineError, GenerationRequest
from grpo_lightning.rollout.vllm_cpu_steps import cpu_step_tokens
from grpo_lightning.rollout.vllm_server_process import _command
from grpo_lightning.rollout.vllm_vision import EngineVision, collapsed, engine_names, write_engine_weights
from grpo_lightning.step.weight_push import policy_weights

IMAGE = 7


def test_collapsing_keeps_one_token_per_image_even_side_by_side():
    """Property: expanding the collapsed ids by the counts gives the ids back."""
    rng = random.Random(0)
    for _ in range(300):
        counts = [rng.randint(1, 6) for _ in range(rng.randint(1, 4))]
        ids = [rng.randint(20, 30) for _ in range(rng.randint(0, 3))]
        for count in counts:
            ids += [IMAGE] * count + [rng.randint(20, 30) for _ in range(rng.choice([0, 0, 1, 2]))]  # 0: side by side
        short = collapsed(ids, IMAGE, counts)
        assert short.count(IMAGE) == len(counts)
        expanded, index = [], 0
        for token in short:
            if token == IMAGE:
                expanded += [IMAGE] * counts[index]
                index += 1
            else:
                expanded.append(token)
        assert expanded == ids
    with pytest.raises(EngineError, match="more image tokens"):
        collapsed([IMAGE] * 5, IMAGE, [2, 2])


def test_a_server_request_holds_the_collapsed_ids_and_the_pixels_encoded_once_per_prompt(tiny_vlm_folders, monkeypatch):
    policy, _ = load_folder(tiny_vlm_folders["llava"])
    engine = EngineVision.of(policy)
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    cmyk = Image.fromarray(rng.integers(0, 256, (9, 7, 4), dtype=np.uint8), mode="CMYK")  # no PNG: as RGB
    vision = VisionInputs("k", ["a", "b", "c"], {}, 48, [rgb, rgb.convert("P"), cmyk])  # 16 tokens an image
    image, run = engine.image_token_id, [engine.image_token_id] * 16
    ids = [1005, 1006, *run, 1007, *run, *run, 1008]  # the last two side by side
    encoded = []
    monkeypatch.setattr(vllm_vision, "image_url", lambda im: encoded.append(im) or f"url{len(encoded)}")
    requests = [GenerationRequest(ids, seed, vision=vision) for seed in range(4)]  # a group shares its images
    bodies = [engine.server_prompt(r) for r in requests]
    assert len(encoded) == 3 and all(b == bodies[0] for b in bodies)
    assert bodies[0]["token_ids"] == [1005, 1006, image, 1007, image, image, 1008]
    assert [part["url"] for part in bodies[0]["content_parts"]] == ["url1", "url2", "url3"]
    monkeypatch.undo()
    for picture in vision.images:
        url = vllm_vision.image_url(picture)
        assert url.startswith("data:image/png;base64,")
        decoded = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
        expected = picture if picture.mode != "CMYK" else picture.convert("RGB")
        assert decoded.mode == expected.mode and np.array_equal(np.asarray(decoded), np.asarray(expected))


def test_a_launched_vlm_server_finds_the_plugin_that_loads_compat_by_its_path(tmp_path, monkeypatch):
    monkeypatch.setattr(compat, "torchvision_installed", lambda: False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("VLLM_PLUGINS", "theirs")
    env = vllm_vision.server_plugin_env(tmp_path)
    assert env == {"PYTHONPATH": f"{tmp_path}:/elsewhere", "VLLM_PLUGINS": f"theirs,{vllm_vision.PLUGIN}"}
    [dist] = list(distributions(path=[str(tmp_path)]))
    [entry] = [e for e in dist.entry_points if e.group == "vllm.general_plugins"]
    assert entry.value == f"{vllm_vision.PLUGIN}:serve_vision"
    source = (tmp_path / f"{vllm_vision.PLUGIN}.py").read_text()
    compile(source, "plugin", "exec")
    assert repr(str(Path(compat.__file__).resolve())) in source  # loaded by its path: the package is not imported
    assert "import grpo_lightning" not in source and "from grpo_lightning" not in source


def test_llava_weights_take_the_hub_names_vllm_loads(tiny_vlm_folders, tmp_path):
    policy, _ = load_folder(tiny_vlm_folders["llava"])
    names = dict(engine_names(policy, policy.state_dict().items()))
    tower = [n for n in names if n.startswith("model.vision_tower.")]
    assert tower and all(n.startswith("model.vision_tower.vision_model.") for n in tower)
    assert "lm_head.weight" in names and any(n.startswith("model.language_model.") for n in names)
    write_engine_weights(policy, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert set(f.keys()) == set(names)
    qwen, _ = load_folder(tiny_vlm_folders["qwen2_vl"])
    assert dict(engine_names(qwen, qwen.state_dict().items())).keys() == qwen.state_dict().keys()


def test_a_frozen_tower_is_pushed_with_the_first_sync_only(tiny_vlm_folders):
    policy, _ = load_folder(tiny_vlm_folders["llava"])  # a folder's tower: frozen
    frozen = {n for n, p in policy.named_parameters() if not p.requires_grad}
    first = dict(policy_weights(policy, 0).tensors)
    later = dict(policy_weights(policy, 1, whole=False).tensors)
    assert len(first) == len(policy.state_dict()) and frozen
    assert len(later) == len(first) - len(frozen)
    assert not any(n.replace(".vision_model.", ".") in frozen for n in later)
    trained, _ = load_folder(tiny_vlm_folders["llava"], freeze_vision="false")
    assert len(policy_weights(trained, 1, whole=False).tensors) == len(first)


def test_a_launched_vlm_server_takes_the_image_limit_and_the_token_budget(tmp_path):
    config = VLLMConfig(images_per_prompt=3, max_num_batched_tokens=9000)
    command = _command("/model", config, 8000, 0, vision=True)
    assert json.loads(command[command.index("--limit-mm-per-prompt") + 1]) == {"image": 3}
    assert command[command.index("--max-num-batched-tokens") + 1] == "9000"
    assert "--no-enable-chunked-prefill" not in command  # a GPU keeps vLLM's chunked prefill
    plain = _command("/model", VLLMConfig(), 8000, 0)
    assert "--limit-mm-per-prompt" not in plain and "--max-num-batched-tokens" not in plain
    # On a CPU: never a prompt split across steps, a step at least the model's context (vllm_cpu_steps.py).
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 6000}}))
    cpu = _command(str(tmp_path), VLLMConfig(), 8000, 0, vision=True, cpu=True)
    assert "--no-enable-chunked-prefill" in cpu and cpu[cpu.index("--max-num-batched-tokens") + 1] == "6000"


def test_a_cpu_step_holds_the_context_and_a_smaller_budget_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    assert cpu_step_tokens(tmp_path, None, None) == 4096  # vLLM's own CPU default, above a short context
    assert cpu_step_tokens(tmp_path, 8192, None) == 8192  # rollout.vllm.max_model_len wins over the config
    assert cpu_step_tokens(tmp_path, None, 20000) == 20000
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens=300 is below the engine's context of 512"):
        cpu_step_tokens(tmp_path, None, 300)
