"""The teacher's pass in the step (step/teacher.py, step/teachers/): the log-probs each kind gives
against the same numbers written out over full logits, the divergence's gradient through the module,
the loss mask of episodes, and a teacher weight of 0 reproducing GRPO bit for bit."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from grpo_lightning.algorithm.distillation import DISTILL_SUMS, jsd_from_logits
from grpo_lightning.config import AlgorithmConfig, ConfigError, LoraModelConfig, TrainConfig
from grpo_lightning.models import build_tiny_policy
from grpo_lightning.models.lora import apply_lora
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.teachers import teacher_line
from grpo_lightning.step.teachers.base import LoraBaseTeacher
from grpo_lightning.step.teachers.context import ContextTeacher
from grpo_lightning.step.teachers.folder import FolderTeacher
from grpo_lightning.step.teachers.server import ServerTeacher, scored_tokens
from tests.helpers.fake_server_engine import FakeServers


def algorithm(objective="reverse_kl", weight=1.0, kind="folder", **fields) -> AlgorithmConfig:
    cfg = AlgorithmConfig(beta=fields.pop("beta", 0.0), **fields)
    cfg.teacher.kind, cfg.teacher.objective, cfg.teacher.weight = kind, objective, weight
    return cfg


def full_logits(model, rollout, row: int, prompt_ids=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [C, V] predicting each completion token, the tokens) of one sequence, written out."""
    prompt = (
        rollout.prompt_ids[row][rollout.prompt_mask[row].bool()] if prompt_ids is None else torch.tensor(prompt_ids)
    )
    completion = rollout.completion_ids[row][rollout.completion_mask[row].bool()]
    ids = torch.cat([prompt, completion])[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return logits.double() / rollout.temperature, completion


@pytest.fixture
def teacher_model(tokenizer):
    return build_tiny_policy(tokenizer, seed=7).eval()


@pytest.mark.parametrize("pack", [True, False])
def test_a_folder_teacher_scores_the_sampled_tokens_at_the_sampling_temperature(policy, rollout, teacher_model, pack):
    rollout = replace(rollout, temperature=0.7)
    cfg = algorithm(pack_sequences=pack)
    module = GRPOModule(policy, cfg, teacher=FolderTeacher(cfg, teacher_model))
    prepared = module.prepare(rollout)
    scores = module.distill.scores
    for row in range(rollout.num_sequences):
        logits, tokens = full_logits(teacher_model, rollout, row)
        want = torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
        got = prepared.teacher.logp[row, : len(tokens)]
        assert torch.allclose(got.double(), want, atol=2e-5), row
        assert scores.argmax[row, : len(tokens)].tolist() == logits.argmax(-1).tolist()


def test_a_context_teacher_scores_the_completion_under_its_own_prompt(policy, rollout, tokenizer):
    cfg = TrainConfig()
    cfg.algorithm.beta, cfg.algorithm.teacher.kind = 0.0, "context"
    cfg.algorithm.teacher.context.prefix = "2+2=4 "
    teacher = ContextTeacher.from_config(cfg, tokenizer, policy)
    initial = copy.deepcopy(policy)
    module = GRPOModule(policy, cfg.algorithm, teacher=teacher)
    assert teacher._frozen is not policy and not any(p.requires_grad for p in teacher._frozen.parameters())
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)  # the student moves on; the teacher is the initial policy
    prepared = module.prepare(rollout)
    for row in range(rollout.num_sequences):
        ids = tokenizer("2+2=4 " + rollout.prompts[row])["input_ids"]
        logits, tokens = full_logits(initial, rollout, row, ids)
        want = torch.log_softmax(logits, -1).gather(-1, tokens[:, None])[:, 0]
        assert torch.allclose(prepared.teacher.logp[row, : len(tokens)].double(), want, atol=2e-5), row


def test_a_context_teacher_is_the_reference_when_there_is_one(policy, tokenizer):
    cfg = TrainConfig()
    cfg.algorithm.teacher.kind = "context"  # beta 0.04: a reference model
    teacher = ContextTeacher.from_config(cfg, tokenizer, policy)
    module = GRPOModule(policy, cfg.algorithm, teacher=teacher)
    assert teacher._frozen is module.reference


def test_the_student_as_its_own_teacher_gives_no_signal_and_full_agreement(policy, rollout, tokenizer):
    """A LoRA policy's base at the start (adapters at zero) is the policy: KL 0, advantages 0, argmax agreed."""
    lora = apply_lora(policy, LoraModelConfig(rank=4))
    cfg = algorithm(kind="base")
    module = GRPOModule(lora, cfg, teacher=LoraBaseTeacher(cfg, lora))
    module.accumulate_gradients(rollout, module.prepare(rollout))
    metrics = module.distill.metrics(lambda x: x)
    assert abs(metrics["distill/kl"]) < 1e-5 and abs(metrics["distill/advantage_mean"]) < 1e-5
    assert metrics["distill/argmax_agreement"] == 1.0


def test_weight_zero_reproduces_grpo_bit_for_bit(policy, rollout, teacher_model):
    def grads(teacher):
        cfg = algorithm(weight=0.0)
        module = GRPOModule(copy.deepcopy(policy), cfg, teacher=teacher and FolderTeacher(cfg, teacher_model))
        module.accumulate_gradients(rollout, module.prepare(rollout))
        return [p.grad for p in module.policy.parameters()]

    for a, b in zip(grads(None), grads(True), strict=True):
        assert torch.equal(a, b)


def test_the_divergence_objective_through_the_module(policy, rollout, teacher_model):
    """grad(with the JSD) - grad(weight 0) = weight x grad of seq_mean_token_mean(JSD) written out over full logits;
    its metric is the JSD's token mean."""
    weight, beta = 0.5, 0.3

    def run(w):
        cfg = algorithm("jsd", w)
        cfg.teacher.jsd.beta = beta
        module = GRPOModule(copy.deepcopy(policy), cfg, teacher=FolderTeacher(cfg, teacher_model))
        module.accumulate_gradients(rollout, module.prepare(rollout))
        return module, [p.grad.double() for p in module.policy.parameters()]

    module, with_jsd = run(weight)
    _, without = run(0.0)
    student = copy.deepcopy(policy).double()
    values = []
    for row in range(rollout.num_sequences):
        prompt = rollout.prompt_ids[row][rollout.prompt_mask[row].bool()]
        completion = rollout.completion_ids[row][rollout.completion_mask[row].bool()]
        ids = torch.cat([prompt, completion])[None]
        z_s = student(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        z_t, _ = full_logits(teacher_model, rollout, row)
        values.append(jsd_from_logits(z_s, z_t, beta).mean())  # seq_mean_token_mean: each sequence's token mean
    explicit = torch.stack(values).mean()
    explicit.backward()
    for got_with, got_without, param in zip(with_jsd, without, student.parameters(), strict=True):
        assert torch.allclose(got_with - got_without, weight * param.grad, atol=1e-6)
    tokens = rollout.completion_mask.sum()
    want = sum(v * n for v, n in zip(values, rollout.completion_mask.sum(1), strict=True)) / tokens
    assert module.distill.metrics(lambda x: x)["distill/divergence"] == pytest.approx(float(want.detach()), rel=1e-4)


def test_environment_tokens_are_never_scored_into_the_loss(policy, rollout, teacher_model):
    """An episode's loss mask: the teacher's terms count the model's own tokens only, and what the teacher
    says of an environment's token changes nothing (not the gradient, not the metrics)."""
    loss_mask = rollout.completion_mask.clone()
    loss_mask[:, 1::2] = 0  # every other token an environment's
    episode = replace(rollout, loss_mask=loss_mask)
    cfg = algorithm()
    cfg.teacher.reverse_kl.discount = 0.9  # the discount must skip them too

    def run(corrupt: bool):
        module = GRPOModule(copy.deepcopy(policy), cfg, teacher=FolderTeacher(cfg, teacher_model))
        prepared = module.prepare(episode)
        if corrupt:
            prepared.teacher.logp[loss_mask == 0] = 50.0
        module.accumulate_gradients(episode, prepared)
        sums = dict(zip(DISTILL_SUMS, torch.stack(module.distill._sums).sum(0).tolist(), strict=True))
        return sums, [p.grad for p in module.policy.parameters()]

    sums, grads = run(False)
    corrupted_sums, corrupted_grads = run(True)
    assert sums["tokens"] == float(loss_mask.sum()) and sums == corrupted_sums
    assert all(torch.equal(a, b) for a, b in zip(grads, corrupted_grads, strict=True))


def test_a_served_teacher_scores_each_sequence_through_prompt_logprobs(rollout, tmp_path):
    servers = FakeServers(tmp_path)
    try:
        engine, _ = servers.start()
        teacher = ServerTeacher(engine.client, concurrency=4)
        scores = teacher.score(rollout, [], need_rows=False, need_argmax=True)
    finally:
        servers.close()
    mask = rollout.completion_mask.bool()
    assert bool((scores.logprobs.logp[mask] == -1.0).all()) and bool((scores.logprobs.logp[~mask] == 0).all())
    assert torch.equal(scores.argmax[mask], rollout.completion_ids[mask])  # the fake ranks each token first


def test_vllm_prompt_logprobs_are_read_for_the_completion_only():
    answer = [
        None,
        {"5": {"logprob": -0.1, "rank": 1}},
        {"7": {"logprob": -2.0, "rank": 3}, "4": {"logprob": -0.2, "rank": 1}},
    ]
    assert scored_tokens(answer, [1, 5, 7], first=1) == ([-0.1, -2.0], [5, 4])


def test_the_run_states_the_teachers_temperature_and_which_pass_it_replaces():
    cfg = TrainConfig()
    cfg.algorithm.teacher.kind, cfg.algorithm.beta, cfg.rollout.temperature = "context", 0.0, 0.7
    cfg.task.rewards = {"arithmetic_exact": 0.0}
    line = teacher_line(cfg)
    assert "at the sampling temperature 0.7" in line and "replaces the reference pass" in line
    assert "objective reverse_kl (discount 0.0)" in line and "pure distillation" in line


def test_a_divergence_needs_a_plain_output_head_and_says_so_before_training(policy, teacher_model):
    policy.config.final_logit_softcapping = 30.0  # logits are no longer head(hidden)
    cfg = algorithm("jsd")
    with pytest.raises(ConfigError, match="has no plain head"):
        GRPOModule(policy, cfg, teacher=FolderTeacher(cfg, teacher_model))
    GRPOModule(policy, algorithm(), teacher=FolderTeacher(cfg, teacher_model))  # the sampled form needs none
