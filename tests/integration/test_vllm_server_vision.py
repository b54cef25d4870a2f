"""A vision-language policy on a launched CPU vLLM server: one server start for the module.

The 2-step CLI run ``model=tiny_vlm task=shapes rollout.engine=vllm rollout.vllm.server.launch=true``
launches it; the run's engine is kept up past the run (its close deferred to the module's end), so
the weight-sync test reuses the same server. Token in, token out: the prompt ids and completion ids
every trained row holds are the ones the server returned (its expansion of the images checked
against the trainer's by the engine), the engine's log-probs of them are the trainer's within 1e-4
nats (float32; measured ~1e-6) at both steps, the second after a sync of the trained tower; and a
sync that changes only the vision side changes what the server computes for the same images (its
encoder cache reset, the tower's weights under vLLM's names), to the new policy's log-probs.
"""

from __future__ import annotations

import copy
import csv
import json
import random
import sys
import threading

import pytest
import torch
from helpers.vision import policy_logprobs, random_records, vision_generator

from grpo_lightning import train
from grpo_lightning.config import ModelConfig
from grpo_lightning.models import load_policy
from grpo_lightning.models.vision.families import family_of
from grpo_lightning.rollout.vllm_server import VLLMServerEngine
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.weight_push import policy_weights

TOLERANCE = 1e-4  # nats, float32 engine and trainer


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    """The CLI run's output folder, what the server returned per request with images, the rows trained on,
    and the run's engine (still up)."""
    out = tmp_path_factory.mktemp("vlm_server_run") / "run"
    engines, sampled, trained, lock = [], [], [], threading.Lock()
    with pytest.MonkeyPatch.context() as patch:
        one, accumulate = VLLMServerEngine._one_with_images, GRPOModule.accumulate_gradients

        def recorded_one(self, request, sampling):
            completion = one(self, request, sampling)
            with lock:  # requests run on the engine's threads
                sampled.append((tuple(request.prompt_ids), tuple(completion.token_ids), tuple(completion.logprobs)))
            return completion

        def recorded_pass(self, rollout, prepared, record_old=False):
            trained.append(rollout)
            return accumulate(self, rollout, prepared, record_old=record_old)

        patch.setattr(VLLMServerEngine, "_one_with_images", recorded_one)
        patch.setattr(GRPOModule, "accumulate_gradients", recorded_pass)
        patch.setattr(VLLMServerEngine, "close", lambda self: engines.append(self))  # closed below
        patch.setenv("HF_HUB_OFFLINE", "1")
        argv = [
            "grpo-lightning",
            "model=tiny_vlm",
            "task=shapes",
            "rollout.engine=vllm",
            "rollout.vllm.server.launch=true",
            "rollout.vllm.max_model_len=256",
            "rollout.vllm.kv_cache_gib=0.25",
            "rollout.prompts_per_step=2",
            "rollout.num_generations=4",
            "trainer.max_steps=2",
            "eval.before_training=false",
            "eval.num_prompts=2",  # the closing evaluation's greedy requests go through the server too
            "logger=csv",
            "logger.report_png=false",
            f"hydra.run.dir={out}",
        ]
        patch.setattr(sys, "argv", argv)
        try:
            train.cli()
        except SystemExit as stop:
            assert stop.code in (0, None), f"exit {stop.code}"
    yield out, sampled, trained, engines
    for engine in engines:
        VLLMServerEngine.close(engine)


def test_a_tiny_vlm_trains_two_steps_on_a_launched_vllm_server_through_the_cli(served_run):
    """The engine's log-probs of the sampled ids are the trainer's at both steps (mismatch/abs_logp_diff_max)."""
    out, _, _, engines = served_run
    assert len(engines) == 1 and engines[0].vision is not None
    [metrics] = out.glob("csv/version_*/metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("mismatch/abs_logp_diff_max")]
    assert len(rows) == 2, rows
    assert all(float(r["mismatch/abs_logp_diff_max"]) < TOLERANCE for r in rows), rows
    lines = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert lines and all(line["images"] for line in lines)


def test_the_ids_trained_are_the_ids_the_server_sampled(served_run):
    """The trained rows (prompt with its images expanded, completion, engine log-probs) are the 16 the server
    returned for the two steps (the closing evaluation's requests come after them), log-probs aligned."""
    _, sampled, trained, _ = served_run
    rows = []
    for batch in trained:
        completions, logprobs = batch.completion_layout(), batch.completion_layout("engine_logprobs")
        for i in range(batch.num_sequences):
            prompt = batch.prompt_ids[i][batch.prompt_mask[i].bool()]
            rows.append(
                (tuple(prompt.tolist()), tuple(completions.sequence(i).tolist()), tuple(logprobs.sequence(i).tolist()))
            )
    served = [(p, c, tuple(torch.tensor(lp, dtype=torch.float32).tolist())) for p, c, lp in sampled[: len(rows)]]
    assert len(trained) == 2 and len(rows) == 16 and len(sampled) > len(rows)
    assert sorted(rows) == sorted(served)


def test_a_weight_sync_changes_what_the_server_computes_for_the_same_images(served_run):
    """Push a policy, then the same policy with only its vision side changed: for the same prompts with 1-3
    images the server's log-probs follow each push (the second would keep the first's image features if the
    encoder cache or the tower's names were wrong)."""
    engine = served_run[3][0]
    policy, tokenizer = load_policy(ModelConfig(name_or_path="tiny_vlm"))
    changed = copy.deepcopy(policy)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in changed.named_parameters():
            if name.startswith(family_of(changed).vision_prefixes):
                param.add_(0.1 * torch.randn(param.shape, generator=noise))
    records = random_records(random.Random(0), 2)

    def served(model, version):
        engine.load_weights(policy_weights(model, version).tensors, version=version)
        batch = vision_generator(model, tokenizer, 2, engine=engine, max_new_tokens=3).generate(records, step=0, rank=0)
        mask = batch.completion_mask.bool()
        return {
            label: float((policy_logprobs(p, batch, pack=False, size=4)[0] - batch.engine_logprobs).abs()[mask].max())
            for label, p in (("first", policy), ("changed", changed))
        }

    first = served(policy, 10)
    assert first["first"] < TOLERANCE and first["changed"] > 100 * TOLERANCE, first
    after = served(changed, 11)
    assert after["changed"] < TOLERANCE and after["first"] > 100 * TOLERANCE, after
