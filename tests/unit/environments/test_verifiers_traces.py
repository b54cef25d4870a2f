"""verifiers traces -> RolloutBatch: on traces recorded from the real verifiers 0.4 package
(tests/helpers/verifiers_traces.json, with what the token-in endpoint returned), and a property test
over random message graphs (several turns, masks in any layout, failed traces)."""

from __future__ import annotations

import json
import random
from itertools import pairwise
from pathlib import Path

import pytest

from grpo_lightning.environments.adapters.verifiers_traces import trace_sample, traces_to_batch

RECORDED = json.loads((Path(__file__).parents[2] / "helpers" / "verifiers_traces.json").read_text())


def unpadded(batch, row):
    """The row's prompt and completion ids, loss mask, log-probs and turns without padding."""
    prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()].tolist()
    real = batch.completion_mask[row].bool()
    fields = [batch.completion_ids, batch.loss_mask, batch.engine_logprobs, batch.turn_ids]
    return [prompt, *(f[row][real].tolist() for f in fields)]


def test_recorded_traces_train_on_exactly_what_the_endpoint_returned():
    traces, answers = RECORDED["traces"], RECORDED["server_answers"]
    batch = traces_to_batch(traces, group_size=3, pad_id=0, max_new_tokens=8, temperature=1.0)
    returned = {tuple(a["token_ids"]): a for a in answers}  # the episodes ran concurrently: match by ids
    for row, trace in enumerate(traces):
        prompt, ids, mask, logprobs, _ = unpadded(batch, row)
        assert prompt + ids == [i for node in trace["nodes"] for i in node["token_ids"]]  # nothing re-tokenized
        sampled = [i for i, m in zip(ids, mask, strict=True) if m]
        answer = returned[tuple(sampled)]
        expected = [c["logprob"] for c in answer["logprobs"]["content"]]
        assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == pytest.approx(expected)
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        assert bool(batch.finished[row]) == (answer["finish_reason"] == "stop")
        reward = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert batch.rewards[row].item() == pytest.approx(reward)


def random_trace(rng: random.Random) -> tuple[dict, list[int], list[int], list[float]]:
    """A linear message graph (shuffled node order) and its ids, sampled mask and log-probs in path order."""
    n = rng.randint(2, 7)
    ids, mask, logprobs, nodes = [], [], [], []
    for k in range(n):
        size = rng.randint(0 if k else 1, 6)
        node_ids = [rng.randrange(50) for _ in range(size)]
        if k == 0:
            node_mask = [False] * size
        elif rng.random() < 0.5:  # the canonical layout: a header, then the sampled suffix
            cut = rng.randint(0, size)
            node_mask = [False] * cut + [True] * (size - cut)
        else:
            node_mask = [rng.random() < 0.5 for _ in range(size)]
        node_lps = [-rng.random() * 5 for m in node_mask if m]
        nodes.append({"token_ids": node_ids, "mask": node_mask, "logprobs": node_lps})
        ids += node_ids
        mask += [int(m) for m in node_mask]
        it = iter(node_lps)
        logprobs += [next(it) if m else 0.0 for m in node_mask]
    if 1 not in mask:  # at least one sampled token
        nodes[-1]["token_ids"].append(7)
        nodes[-1]["mask"].append(True)
        nodes[-1]["logprobs"].append(-0.5)
        ids, mask, logprobs = ids + [7], mask + [1], logprobs + [-0.5]
    order = list(range(n))
    rng.shuffle(order)  # stored in any order: the path follows the parents
    position = {k: i for i, k in enumerate(order)}
    stored = [None] * n
    for k, node in enumerate(nodes):
        stored[position[k]] = {**node, "parent": position[k - 1] if k else None}
    record = {
        "id": "t",
        "nodes": stored,
        "ok": rng.random() < 0.8,
        "rewards": {"a": {"score": rng.random(), "weight": 2.0}},
        "calls": [{"error": None, "finish_reason": rng.choice(["stop", "length"])}],
    }
    return record, ids, mask, logprobs


def test_property_random_graphs_keep_ids_masks_and_logprobs_aligned():
    rng = random.Random(0)
    for _ in range(100):
        cases = [random_trace(rng) for _ in range(4)]
        batch = traces_to_batch([c[0] for c in cases], 2, pad_id=0, max_new_tokens=16, temperature=1.0)
        for row, (record, ids, mask, logprobs) in enumerate(cases):
            prompt, completion, loss_mask, engine_lps, turns = unpadded(batch, row)
            start = mask.index(1)
            assert prompt == ids[:start] and completion == ids[start:]
            assert engine_lps == pytest.approx(logprobs[start:])
            assert loss_mask == (mask[start:] if record["ok"] else [0] * len(completion))
            assert turns[0] == 0 and all(b - a in (0, 1) for a, b in pairwise(turns))
            span_starts = [k for k in range(start, len(ids)) if mask[k] and (k == start or not mask[k - 1])]
            assert turns[-1] == len(span_starts) - 1
            reward = 0.0 if not record["ok"] else 2 * record["rewards"]["a"]["score"]
            assert batch.rewards[row].item() == pytest.approx(reward)
            assert bool(batch.finished[row]) == (record["calls"][0]["finish_reason"] == "stop")
        padding = ~batch.completion_mask.bool()
        assert not batch.loss_mask[padding].any() and not batch.engine_logprobs[padding].any()


def test_traces_that_cannot_be_one_sample_are_refused():
    record, *_ = random_trace(random.Random(1))
    branching = {**record, "nodes": [*record["nodes"], {**record["nodes"][-1], "parent": None}]}
    with pytest.raises(ValueError, match="branches"):
        trace_sample(branching)
    unsampled = {**record, "nodes": [{"token_ids": [1, 2], "mask": [False, False], "logprobs": [], "parent": None}]}
    with pytest.raises(ValueError, match="no sampled token"):
        trace_sample(unsampled)
    short = {**record, "nodes": [{"token_ids": [1, 2], "mask": [True, True], "logprobs": [-1.0], "parent": None}]}
    with pytest.raises(ValueError, match="1 log-probs for 2 sampled"):
        trace_sample(short)
