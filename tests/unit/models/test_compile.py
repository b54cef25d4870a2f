"""model.compile: the training passes through compiled decoder layers give eager's log-probs
and gradients (to float rounding), generation stays eager, and bad combinations are refused."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import PROMPTS, make_generator
from torch._dynamo.utils import counters

from grpo_lightning.build import build_run
from grpo_lightning.config import AlgorithmConfig, TrainConfig, validate_config
from grpo_lightning.models.compile import compile_training_models, eager_generation, is_compiled, layers_to_compile
from grpo_lightning.step.module import GRPOModule


def _pass(module: GRPOModule, rollout):
    stats = module.accumulate_gradients(rollout, module.prepare(rollout))
    grads = {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    return grads, stats


@pytest.mark.slow
def test_compiled_layers_give_eager_gradients_with_and_without_the_reference(policy, rollout):
    torch._dynamo.reset()
    counters.clear()
    # Without the reference only the policy's layers are wrapped (compiling is lazy: nothing runs yet).
    without = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(beta=0.0))
    assert compile_training_models(without) == len(layers_to_compile(policy))
    assert is_compiled(without.policy) and without.reference is None
    # With it, both; one compiled run (the slow part: inductor's C++ builds) checks the values.
    algorithm = AlgorithmConfig(beta=0.1, micro_batch_size=16)
    reference = copy.deepcopy(policy)  # moved off the policy, so the KL and its gradient are not 0
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    eager = GRPOModule(copy.deepcopy(policy), algorithm, reference=copy.deepcopy(reference))
    compiled = GRPOModule(copy.deepcopy(policy), algorithm, reference=copy.deepcopy(reference))
    assert compile_training_models(compiled) == 2 * len(layers_to_compile(policy))  # policy and reference
    assert is_compiled(compiled.policy) and is_compiled(compiled.reference) and not is_compiled(eager.policy)
    want, want_stats = _pass(eager, rollout)
    got, got_stats = _pass(compiled, rollout)
    assert want.keys() == got.keys() and want
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=name)
    assert abs(got_stats.loss - want_stats.loss) < 1e-5
    assert abs(got_stats.kl_sum - want_stats.kl_sum) < 1e-5 and want_stats.kl_sum != 0
    # the compiled path really ran: dynamo captured graphs (one per layer signature, not per layer)
    assert counters["stats"]["unique_graphs"] > 0


def test_generation_with_compiled_layers_is_eager_and_identical(policy, tokenizer):
    compiled_policy = copy.deepcopy(policy)
    compile_training_models(GRPOModule(compiled_policy, AlgorithmConfig()))
    torch._dynamo.reset()
    counters.clear()
    want = make_generator(policy, tokenizer, max_new_tokens=12).generate(PROMPTS, step=3, rank=0)
    got = make_generator(compiled_policy, tokenizer, max_new_tokens=12).generate(PROMPTS, step=3, rank=0)
    assert torch.equal(got.completion_ids, want.completion_ids)
    assert torch.equal(got.completion_mask, want.completion_mask)
    assert counters["stats"]["unique_graphs"] == 0  # nothing was compiled while decoding
    # ... and the training passes get their compiled layers back, also after an error
    assert all(layer._compiled_call_impl is not None for layer in layers_to_compile(compiled_policy))
    with pytest.raises(RuntimeError, match="mid-decode"):
        with eager_generation(compiled_policy):
            assert all(layer._compiled_call_impl is None for layer in layers_to_compile(compiled_policy))
            raise RuntimeError("mid-decode")
    assert all(layer._compiled_call_impl is not None for layer in layers_to_compile(compiled_policy))


def test_compile_with_fsdp_is_refused_naming_both_fields():
    cfg = TrainConfig()
    cfg.model.compile, cfg.trainer.strategy = True, "fsdp"
    with pytest.raises(ValueError, match=r"model.compile=true with trainer.strategy=fsdp .* set model.compile=false"):
        validate_config(cfg)


def test_a_model_without_decoder_layers_is_refused_with_the_fix():
    with pytest.raises(
        ValueError, match=r"model.compile=true: cannot find the decoder layers of Linear .* model.compile=false"
    ):
        layers_to_compile(torch.nn.Linear(2, 2))


def test_build_run_compiles_policy_and_reference_only_when_asked(config_factory):
    for wanted in (False, True):
        run = build_run(config_factory(1, **{"model.compile": wanted, "algorithm.beta": 0.04}))
        assert is_compiled(run.module.policy) is wanted
        assert is_compiled(run.module.reference) is wanted
