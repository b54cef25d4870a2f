"""The typed records carry a multi-turn episode (a sketch with a fake engine), and the
variable-length layout converts to and from the padded one exactly (property tests)."""

from __future__ import annotations

import ast
import copy
import random
import sys
from pathlib import Path

import pytest
import torch

import grpo_lightning
from grpo_lightning.algorithm.packing import pack_layout, pack_micro_batch
from grpo_lightning.config import AlgorithmConfig, RolloutConfig
from grpo_lightning.records import Completion, PolicyWeights, RolloutBatch
from grpo_lightning.records.varlen import VarLen
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import GenerationRequest, RolloutGenerator, Sampling
from grpo_lightning.rollout.engine import EngineBase, RolloutEngine
from grpo_lightning.rollout.weight_sync import ProbeScores, WeightSync, WeightSyncError
from grpo_lightning.step.module import GRPOModule

ENV_MESSAGE = [16, 7, 9]  # the environment's reply: attended to, never trained on


class FakeEngine(EngineBase):
    """Samples ``turn_length`` tokens per request from the request's seed, with made-up log-probs,
    at the weight version of its last sync."""

    owns_weights = True

    def __init__(self, turn_length: int = 4):
        self.turn_length = turn_length
        self.version = 0
        self.requests: list[GenerationRequest] = []

    def generate(self, requests, sampling):
        out = []
        for request in requests:
            self.requests.append(request)
            rng = random.Random(request.seed)
            ids = [rng.randrange(3, 19) for _ in range(self.turn_length)]
            logprobs = [-rng.uniform(0.5, 3.0) for _ in ids]
            out.append(Completion(ids, finished=True, logprobs=logprobs, weight_version=self.version))
        return out

    def load_weights(self, named_tensors, version=None) -> float:
        self.loaded = dict(named_tensors)
        self.version = version
        return 0.0

    def sequence_logprobs(self, prompt_ids, completion_ids):
        return [-1.0] * len(completion_ids)


def run_episode(engine: FakeEngine, prompt_ids: list[int], seed: int) -> Completion:
    """Turn 1 (model), the environment's message, turn 2 (model), as one completion record."""
    sampling = Sampling.from_config(RolloutConfig(max_new_tokens=16))
    first = engine.generate([GenerationRequest(prompt_ids, seed)], sampling)[0]
    engine.version += 1  # a weight sync between the turns: turn 2 is sampled by newer weights
    second = engine.generate([GenerationRequest(prompt_ids + first.token_ids + ENV_MESSAGE, seed + 1)], sampling)[0]
    env = len(ENV_MESSAGE)
    return Completion(
        token_ids=first.token_ids + ENV_MESSAGE + second.token_ids,
        finished=second.finished,
        logprobs=first.logprobs + [0.0] * env + second.logprobs,
        weight_version=first.weight_version,
        token_weight_versions=[first.weight_version] * len(first.token_ids)
        + [-1] * env
        + [second.weight_version] * len(second.token_ids),
        loss_mask=[1] * len(first.token_ids) + [0] * env + [1] * len(second.token_ids),
        turn_ids=[0] * len(first.token_ids) + [1] * env + [2] * len(second.token_ids),
    )


@pytest.fixture
def episodes(tokenizer):
    """Two groups of two two-turn episodes (turn lengths differ between groups), assembled by the real generator."""
    engine = FakeEngine()
    generator = RolloutGenerator(
        engine,
        tokenizer,
        RewardScorer.from_names({"arithmetic_exact": 1.0}),
        num_generations=2,
        sampling=Sampling.from_config(RolloutConfig(max_new_tokens=16)),
    )
    records = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "13+4=", "answer": "17"}]
    requests = generator.build_requests(records, step=0, rank=0)
    completions = []
    for i, request in enumerate(requests):
        engine.turn_length = 3 + i  # ragged episodes
        completions.append(run_episode(engine, request.prompt_ids, request.seed))
        engine.version = 0
    batch = generator.assemble(records, requests, completions, step=0, generation_seconds=0.0)
    batch.rewards = torch.tensor([1.0, 0.0, 0.25, 0.75])
    batch.episode_ids = torch.arange(batch.num_sequences)
    return batch, completions, engine


def test_the_records_carry_a_two_turn_episode(episodes):
    batch, completions, engine = episodes
    # Turn 2 was asked for with turn 1 and the environment's message appended to the prompt: a prefix of the record.
    for i, completion in enumerate(completions):
        first, second = engine.requests[2 * i].prompt_ids, engine.requests[2 * i + 1].prompt_ids
        assert second == first + completion.token_ids[: len(second) - len(first)]
        assert second[-len(ENV_MESSAGE) :] == ENV_MESSAGE
    for i, completion in enumerate(completions):
        n = len(completion.token_ids)
        assert batch.completion_ids[i, :n].tolist() == completion.token_ids
        assert batch.completion_mask[i].sum() == n  # the attention mask covers the environment's tokens
        assert batch.loss_mask[i, :n].tolist() == completion.loss_mask
        assert batch.turn_ids[i, :n].tolist() == completion.turn_ids
        assert batch.token_weight_versions[i, :n].tolist() == completion.token_weight_versions
        assert torch.allclose(batch.engine_logprobs[i, :n], torch.tensor(completion.logprobs))
        assert batch.loss_mask[i, n:].sum() == 0 and (batch.turn_ids[i, n:] == -1).all()
    # Model tokens of turn 2 carry the newer version, environment tokens none.
    assert set(batch.token_weight_versions[batch.turn_ids == 2].tolist()) == {1}
    assert set(batch.token_weight_versions[batch.turn_ids == 1].tolist()) == {-1}
    assert batch.weight_version == 0
    # The variable-length view keeps the per-token fields aligned with the ids.
    ids, mask = batch.completion_layout(), batch.completion_layout("loss_mask")
    assert ids.lengths.tolist() == [len(c.token_ids) for c in completions]
    assert torch.equal(ids.values[mask.values.bool() == 0], torch.tensor(ENV_MESSAGE * len(completions)))
    # The batch survives a device move with every record field.
    moved = batch.to("cpu")
    assert torch.equal(moved.loss_mask, batch.loss_mask) and torch.equal(moved.episode_ids, batch.episode_ids)


def _hand_loss(policy, batch: RolloutBatch, advantages: torch.Tensor, cap: float) -> torch.Tensor:
    """token_mean of -A * ratio * TIS weight over the model's tokens only, from a plain forward."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attention = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    positions = (attention.cumsum(dim=1) - 1).clamp(min=0)
    logits = policy(input_ids=ids, attention_mask=attention, position_ids=positions).logits.float()
    width = batch.prompt_ids.shape[1]
    logp = torch.log_softmax(logits[:, width - 1 : -1], dim=-1).gather(-1, batch.completion_ids[..., None])[..., 0]
    mask = batch.loss_mask.float()
    weights = torch.exp(logp.detach() - batch.engine_logprobs).clamp(max=cap)
    per_token = -advantages[:, None] * torch.exp(logp - logp.detach()) * weights
    return (per_token * mask).sum() / mask.sum()


@pytest.mark.parametrize("pack", [False, True])
def test_the_loss_counts_only_the_model_tokens(policy, episodes, pack):
    batch, _, _ = episodes
    cfg = AlgorithmConfig(beta=0.0, loss_agg="token_mean", is_level="token", is_cap=2.0, pack_sequences=pack)
    module = GRPOModule(copy.deepcopy(policy), cfg)
    prepared = module.prepare(batch)
    stats = module.accumulate_gradients(batch, prepared)
    assert stats.kept_tokens == batch.loss_mask.sum()  # not the environment's tokens
    assert stats.engine_tokens == batch.loss_mask.sum()
    reference = copy.deepcopy(policy)
    want = _hand_loss(reference, batch, prepared.advantages, cfg.is_cap)
    want.backward()
    assert stats.loss == pytest.approx(float(want), rel=1e-4, abs=1e-6)
    for (name, got), want_param in zip(module.policy.named_parameters(), reference.parameters(), strict=True):
        if want_param.grad is not None:
            assert torch.allclose(got.grad, want_param.grad, rtol=1e-3, atol=1e-6), name
    # The environment's tokens could say anything: the loss does not change.
    other = copy.copy(batch)
    env = batch.completion_mask.bool() & ~batch.loss_mask.bool()
    other.engine_logprobs = batch.engine_logprobs.masked_fill(env, -7.0)
    module.policy.zero_grad()
    assert module.accumulate_gradients(other, module.prepare(other)).loss == pytest.approx(stats.loss, rel=1e-6)


def test_packing_consumes_the_layout(episodes):
    batch, _, _ = episodes
    tokens, prompt_lengths = batch.sequences()
    assert torch.equal(tokens.lengths, prompt_lengths + batch.completion_mask.sum(dim=1))
    from_layout = pack_layout(tokens, batch.completion_mask.bool())
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attention = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    from_padded = pack_micro_batch(ids, attention, batch.prompt_ids.shape[1])
    for name in ("input_ids", "position_ids", "source", "targets", "completion_valid"):
        assert torch.equal(getattr(from_layout, name), getattr(from_padded, name)), name
    # Each completion token is predicted from the packed position just before it.
    flat = from_layout.input_ids.reshape(-1)
    assert torch.equal(flat[from_layout.source + 1], batch.completion_ids[batch.completion_mask.bool()])


# ----------------------------------------------------------------------- the variable-length layout
def _random_rows(rng: random.Random, max_rows: int = 6, max_len: int = 9) -> list[list[int]]:
    return [[rng.randrange(100) for _ in range(rng.randrange(max_len))] for _ in range(rng.randrange(1, max_rows))]


@pytest.mark.parametrize("seed", range(200))
def test_varlen_round_trips_through_the_padded_layout(seed):
    rng = random.Random(seed)
    rows = _random_rows(rng)
    layout = VarLen.from_lists(rows)
    assert layout.lengths.tolist() == [len(r) for r in rows]
    assert layout.cu_seqlens.dtype == torch.int32 and layout.cu_seqlens[-1] == sum(map(len, rows))
    for i, row in enumerate(rows):
        assert layout.sequence(i).tolist() == row
    left = rng.random() < 0.5
    width = max(map(len, rows)) + rng.randrange(3)
    padded, mask = layout.to_padded(width, fill=-1, left=left)
    assert padded.shape == (len(rows), width) and torch.equal(mask.sum(dim=1), layout.lengths)
    assert (padded[~mask] == -1).all()
    for i, row in enumerate(rows):
        assert padded[i][mask[i]].tolist() == row
        on = mask[i].nonzero().flatten().tolist()
        assert on == (list(range(width - len(row), width)) if left else list(range(len(row))))
    back = VarLen.from_padded(padded, mask)
    assert torch.equal(back.values, layout.values) and torch.equal(back.offsets, layout.offsets)
    # positions and sequence_index address every value
    assert torch.equal(layout.values, padded[mask])
    assert all(
        layout.sequence(int(s))[int(p)] == v
        for s, p, v in zip(layout.sequence_index(), layout.positions(), layout.values, strict=True)
    )


@pytest.mark.parametrize("seed", range(100))
def test_varlen_from_padded_keeps_masked_positions_in_order(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, width = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
    padded = torch.randint(0, 50, (rows, width, 2), generator=gen)  # trailing dims ride along
    mask = torch.rand(rows, width, generator=gen) < 0.6  # holes anywhere
    layout = VarLen.from_padded(padded, mask)
    for i in range(rows):
        assert torch.equal(layout.sequence(i), padded[i][mask[i]])
    same = layout.with_values(layout.values[:, 0])
    assert same.offsets is layout.offsets and same.values.shape == (int(mask.sum()),)
    _, remask = layout.to_padded(width)
    assert torch.equal(remask.sum(dim=1), mask.sum(dim=1))


@pytest.mark.parametrize("seed", range(100))
def test_pad_token_fields_align_with_the_ids(seed):
    rng = random.Random(seed)
    completions = []
    for row in _random_rows(rng, max_len=7):
        n = len(row)
        completions.append(
            Completion(
                row,
                finished=rng.random() < 0.5,
                logprobs=[-rng.random() for _ in row],
                weight_version=rng.choice([None, 3]),
                loss_mask=[rng.randrange(2) for _ in row] if rng.random() < 0.5 else None,
                turn_ids=sorted(rng.randrange(3) for _ in row) if rng.random() < 0.5 else None,
            )
        )
    ids, mask, _, logprobs = RolloutBatch.pad_completions(completions, pad_id=0)
    extra = RolloutBatch.pad_token_fields(completions)
    assert ("loss_mask" in extra) == any(c.loss_mask is not None for c in completions)
    assert ("turn_ids" in extra) == any(c.turn_ids is not None for c in completions)
    assert ("token_weight_versions" in extra) == any(c.weight_version is not None for c in completions)
    for name, values in extra.items():
        assert values.shape == ids.shape
        for i, c in enumerate(completions):
            n = len(c.token_ids)
            own = {"loss_mask": c.loss_mask, "turn_ids": c.turn_ids, "token_weight_versions": c.versions()}[name]
            default = {"loss_mask": 1, "turn_ids": 0, "token_weight_versions": -1}[name]
            assert values[i, :n].tolist() == (own if own is not None else [default] * n)
            assert (values[i, n:] == (0 if name == "loss_mask" else -1)).all()
    n = len(completions)
    batch = RolloutBatch(
        prompt_ids=torch.ones(n, 1, dtype=torch.long),
        prompt_mask=torch.ones(n, 1, dtype=torch.long),
        completion_ids=ids,
        completion_mask=mask,
        rewards=torch.zeros(n),
        group_size=1,
        max_new_tokens=8,
        temperature=1.0,
        engine_logprobs=logprobs,
        **extra,
    )
    trained = batch.trained_mask.bool()
    assert not (trained & ~mask.bool()).any()  # the loss never counts padding
    assert torch.equal(batch.completion_layout("engine_logprobs").values, logprobs[mask.bool()])


def test_a_loss_mask_on_padding_is_refused():
    ids = torch.ones(2, 3, dtype=torch.long)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    with pytest.raises(ValueError, match="padding"):
        RolloutBatch(ids[:, :1], ids[:, :1], ids, mask, torch.zeros(2), 2, 3, 1.0, loss_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="shape"):
        RolloutBatch(ids[:, :1], ids[:, :1], ids, mask, torch.zeros(2), 2, 3, 1.0, turn_ids=torch.zeros(2, 2))


def test_a_completion_record_refuses_misaligned_per_token_lists():
    with pytest.raises(ValueError, match="loss_mask"):
        Completion([1, 2, 3], finished=True, loss_mask=[1, 0])


def test_the_engine_protocol_and_the_weight_sync_take_records_only():
    engine = FakeEngine()
    assert isinstance(engine, RolloutEngine)  # every method the callers use is declared, none probed
    tensors = {"w": torch.ones(2)}
    sync = WeightSync(verify=True, tolerance=1e-3)
    probe = ProbeScores([3, 4], [5, 6], torch.tensor([-1.0, -1.0]))
    metrics = sync.sync(PolicyWeights(tensors.items(), version=7, seconds=0.5), engine, probe)
    assert engine.version == 7 and engine.loaded.keys() == {"w"} and engine.loaded["w"] is tensors["w"]
    assert metrics == {"rollout/sync_seconds": 0.5, "rollout/sync_probe_diff": 0.0} and sync.synced_at_step == 7
    with pytest.raises(WeightSyncError, match="differ from the policy"):
        sync.check(engine, ProbeScores([3], [5], torch.tensor([-1.5])))
    with pytest.raises(ValueError, match="canary scores"):
        sync.sync(PolicyWeights(tensors.items(), version=8), engine)


def test_an_engine_without_the_protocol_is_refused(tokenizer):
    class GenerateOnly:
        def generate(self, requests, sampling):
            return []

    with pytest.raises(TypeError, match="EngineBase"):
        RolloutGenerator(
            GenerateOnly(),
            tokenizer,
            RewardScorer.from_names({"arithmetic_exact": 1.0}),
            2,
            Sampling.from_config(RolloutConfig(max_new_tokens=8)),
        )


@pytest.mark.parametrize("name", ["__init__", "rollout", "step", "varlen", "plain_state"])
def test_the_records_layer_imports_nothing_above_it(name):
    """records/ sits below every other layer: torch, numpy, the stdlib, errors and itself only."""
    source = Path(grpo_lightning.__file__).parent / "records" / f"{name}.py"
    imported = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module)
    outside = {
        m
        for m in imported
        if m.split(".")[0] not in sys.stdlib_module_names
        and m.split(".")[0] not in {"torch", "numpy"}
        and not m.startswith("grpo_lightning.records")
        and m != "grpo_lightning.errors"
    }
    assert not outside, f"{name}.py imports {outside}"
