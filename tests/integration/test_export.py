"""hf/final: a Hugging Face folder that transformers, vLLM and examples/evaluate.py load.

vLLM: the session's in-process engine (tests/conftest.py) was itself started by vLLM from a
folder written with the same ``save_pretrained`` calls; here vLLM's own config and tokenizer
loaders read the exported folder and the engine runs on its safetensors weights. (Starting
a second in-process engine in one process tears down the state the first runs on, and a
fresh interpreter costs ~30 s: README "A trained model you can load" gives the one-line
manual check.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lightning.config import RolloutConfig
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.rollout import GenerationRequest, Sampling
from grpo_lightning.runtime.export import export_hf

ROOT = Path(__file__).resolve().parents[2]


def exported(tmp_path):
    tok = build_char_tokenizer()
    policy = build_tiny_policy(tok, seed=3)
    return tok, policy, export_hf(policy, tok, tmp_path / "hf" / "final")


def test_export_round_trips_through_transformers(tmp_path):
    tok, policy, folder = exported(tmp_path)
    export_hf(policy, tok, folder)  # replacing an existing folder works too
    assert sorted(p.name for p in folder.parent.iterdir()) == ["final"]  # no staging folder left
    model = AutoModelForCausalLM.from_pretrained(folder)
    loaded = AutoTokenizer.from_pretrained(folder)
    for name, tensor in policy.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    text = "12+3= 4*5-6?"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"] and loaded.decode(loaded(text)["input_ids"]) == text
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (
        tok.pad_token_id,
        tok.eos_token_id,
        "left",
    )
    assert model.generation_config.eos_token_id == tok.eos_token_id


def test_vllm_reads_the_exported_folder_and_generates_what_transformers_does(tmp_path, vllm_session):
    from vllm.tokenizers import get_tokenizer  # noqa: PLC0415  (vllm: seconds; only where used)
    from vllm.transformers_utils.config import get_config  # noqa: PLC0415  (vllm: seconds; only where used)

    tok, policy, folder = exported(tmp_path)
    config = get_config(str(folder), trust_remote_code=False)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 64, 2)
    assert get_tokenizer(str(folder))("3+4=")["input_ids"] == tok("3+4=")["input_ids"]
    vllm_session.engine.load_weights(load_file(folder / "model.safetensors").items())
    prompt = tok("3+4=")["input_ids"]
    greedy = vllm_session.engine.generate(
        [GenerationRequest(prompt, 0)], Sampling.from_config(RolloutConfig(max_new_tokens=6, temperature=1.0, top_k=1))
    )[0].token_ids
    model = AutoModelForCausalLM.from_pretrained(folder)
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert greedy == [t for t in expected[0, len(prompt) :].tolist()][: len(greedy)]
    assert len(greedy) >= 1


def test_examples_evaluate_takes_the_exported_folder(tmp_path, capsys, monkeypatch):
    _, _, folder = exported(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import evaluate as example  # noqa: PLC0415  (examples/evaluate.py: on sys.path only now)

    example.main([f"model.name_or_path={folder}", "eval.num_prompts=4"])
    out = capsys.readouterr().out
    assert "'val/accuracy'" in out and ("ok  " in out or "bad " in out)
    sys.modules.pop("evaluate", None)


def test_an_export_killed_mid_write_leaves_nothing_for_the_next_one(tmp_path):
    """A killed export leaves its staging folder (a whole model) or the replaced copy; the next
    export removes those of dead processes and keeps a running export's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # its pid now names no process
    hf = tmp_path / "hf"
    abandoned = [hf / f".final.tmp{dead.pid}", hf / f".final.old{dead.pid}"]
    running = hf / f".final.tmp{os.getppid()}"  # a live process's export in progress
    unrelated = [hf / f".other.tmp{dead.pid}", hf / ".final.tmpx"]
    for path in [*abandoned, running, *unrelated]:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"partial")
    exported(tmp_path)
    assert not any(p.exists() for p in abandoned)
    assert running.exists() and all(p.exists() for p in unrelated)
