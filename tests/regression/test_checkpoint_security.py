"""Checkpoints are data, never code: every state the package saves loads with
``torch.load(weights_only=True)``, round-trips exactly, and a crafted checkpoint whose
unpickling would run code is refused through the real resume path before anything runs."""

from __future__ import annotations

import io
import math
import pathlib
import pickle
import random
import subprocess
import sys
from collections import deque
from concurrent.futures import Future

import lightning as L
import numpy as np
import pytest
import torch
from conftest import fit as fit_plain
from conftest import make_config

from grpo_lightning.callbacks import HealthMonitor
from grpo_lightning.config import RolloutConfig
from grpo_lightning.errors import CheckpointError
from grpo_lightning.health import Alert
from grpo_lightning.records.plain_state import RefusedState, from_plain, to_plain
from grpo_lightning.rewards import RewardScorer
from grpo_lightning.rollout import AsyncRolloutGenerator, HFEngine, Sampling
from grpo_lightning.rollout.async_generator import PendingGeneration
from grpo_lightning.rollout.engine import Completion, GenerationRequest
from grpo_lightning.runtime.checkpoints import checkpoints_in, rng_state, set_rng_state
from tests.helpers.runs import train


class Payload:
    """Unpickling this creates ``marker``: the stand-in for a checkpoint that runs code."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def reload(value):
    """``value`` through torch.save and ``torch.load(weights_only=True)``, as a resume reads it."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


PLAIN = (type(None), bool, int, float, str)


def assert_plain(value, where="state"):
    """Only JSON-like data and tensors: dicts with str keys, lists, scalars, tensors."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str, f"{where}: key {key!r}"
            assert_plain(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_plain(item, f"{where}[{i}]")
    else:
        assert type(value) in PLAIN or type(value) is torch.Tensor, f"{where}: {type(value).__name__}"


def same(a, b) -> bool:
    """Equal values of the same types (dtypes, deque maxlens, NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (np.ndarray, np.generic)):
        return (
            a.dtype == b.dtype and np.shape(a) == np.shape(b) and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, deque) and a.maxlen != b.maxlen:
        return False
    if isinstance(a, (list, tuple, deque)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Alert):
        return same(vars(a), vars(b))
    return a == b


DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.uint8, np.uint32, np.uint64, np.bool_]


def random_value(rng: random.Random, depth: int = 0):
    kinds = ["none", "bool", "int", "float", "str", "array", "scalar"] + (
        ["list", "tuple", "deque", "dict", "keyed", "alert"] if depth < 3 else []
    )
    kind = rng.choice(kinds)
    if kind == "none":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.randint(-(2**62), 2**62)
    if kind == "float":
        return rng.choice([rng.uniform(-1e9, 1e9), float("inf"), float("-inf"), float("nan"), -0.0])
    if kind == "str":
        return rng.choice(["", "__plain__", "a/b", "é ✓"]) + str(rng.random())
    if kind in ("array", "scalar"):
        dtype = rng.choice(DTYPES)
        shape = [rng.randint(0, 3) for _ in range(rng.randint(0, 3))]
        array = np.random.default_rng(rng.randint(0, 2**31)).integers(0, 255, size=shape).astype(dtype)
        return array.reshape(-1)[0] if kind == "scalar" and array.size else array
    items = [random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    if kind == "deque":
        return deque(items, maxlen=rng.choice([None, len(items) + 1]))
    if kind == "dict":  # str keys, one of them perhaps the tag itself
        return {rng.choice(["k", "__plain__", "x"]) + str(i): v for i, v in enumerate(items)}
    if kind == "keyed":  # int and tuple keys
        return {rng.choice([i, (i, "t")]): v for i, v in enumerate(items)}
    return Alert("c", "F1", "title", rng.randint(0, 9), "evidence", "causes", "fix", {"v": rng.random()})


def test_plain_state_round_trips_exactly_through_a_weights_only_load():
    rng = random.Random(0)
    for case in range(300):
        value = random_value(rng)
        plain = reload(to_plain(value))
        assert_plain(plain)
        assert same(from_plain(plain, classes=(Alert,)), value), (case, value)


def test_plain_state_builds_only_the_dataclasses_it_is_given():
    alert = to_plain(Alert("c", "F1", "t", 1, "e", "c", "f"))
    with pytest.raises(RefusedState, match="names a 'Alert', not one of"):
        from_plain(alert)
    with pytest.raises(TypeError, match="state.x holds a Payload"):
        to_plain({"x": Payload(pathlib.Path("never"))})


def test_rng_state_is_plain_and_restores_every_generator_exactly():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal(), random.gauss(0, 1)  # cached Gaussians: numpy's has_gauss, Python's gauss_next
    state = reload(rng_state())
    assert_plain(state)

    def draws():
        return torch.rand(3).tolist(), np.random.normal(size=3).tolist(), [random.gauss(0, 1) for _ in range(3)]

    expected = draws()
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    set_rng_state(state)
    assert draws() == expected


def test_async_generations_in_flight_are_plain_and_come_back_exactly(tokenizer, policy, tmp_path):
    def generator():
        return AsyncRolloutGenerator(
            engine=HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id),
            tokenizer=tokenizer,
            scorer=RewardScorer.from_names({"arithmetic_exact": 1.0}),
            num_generations=2,
            sampling=Sampling.from_config(RolloutConfig(max_new_tokens=4)),
            max_staleness=2,
        )

    saving = generator()
    for step in (3, 4):
        future: Future = Future()
        future.set_result([Completion([1, 2, step], True, [-0.5, -1.25, -2.0], 7), Completion([5], False)])
        records = [{"prompt": "1+2=", "answer": "3", "meta": (1, "x")}]
        requests = [GenerationRequest([10, 11], 1234 + step), GenerationRequest([10, 11], 99)]
        saving.pending[step] = PendingGeneration(records, requests, future, submitted_at_step=2)
    state = reload(saving.state_dict())
    assert_plain(state)
    loaded = generator()
    loaded.load_state_dict(state)
    assert list(loaded.pending) == [3, 4]
    for step, before in saving.pending.items():
        after = loaded.pending[step]
        assert (after.records, after.requests, after.submitted_at_step) == (
            before.records,
            before.requests,
            before.submitted_at_step,
        )
        assert after.future.result() == before.future.result()

    # a checkpoint of an older version held these pickled: refused, never unpickled
    marker = tmp_path / "MARKER"
    with pytest.raises(RefusedState, match="pickled"):
        generator().load_state_dict({"pending": pickle.dumps(Payload(marker))})
    assert not marker.exists()


def test_health_monitor_memory_is_plain_and_comes_back_exactly():
    run = fit_plain(make_config(3, **{"rollout.prompts_per_step": 4}))
    state = reload(run.health.state_dict())
    assert_plain(state)
    loaded = HealthMonitor(run.health.config)
    loaded.load_state_dict(state)
    assert same(loaded.alerts, run.health.alerts) and loaded.active == run.health.active
    for before, after in zip(run.health.checks, loaded.checks, strict=True):
        saved = {k: v for k, v in vars(before).items() if k not in HealthMonitor._NOT_SAVED}
        assert same({k: vars(after)[k] for k in saved}, saved), before.name


# --------------------------------------------------------------------------- the real resume path
def config(make_config, tmp_path, name, steps, **overrides):
    return make_config(
        steps,
        **{
            "rollout.prompts_per_step": 2,
            "rollout.num_generations": 2,
            "rollout.max_new_tokens": 4,
            "algorithm.micro_batch_size": 4,
            "trainer.checkpoint_every_n_steps": 1,
            "trainer.output_dir": str(tmp_path / name),
            "eval.before_training": False,
            "eval.num_prompts": 2,
            **overrides,
        },
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real checkpoint, written after step 1 of a tiny run."""
    folder = tmp_path_factory.mktemp("made")
    train(config(make_config, folder, "made", 1))
    [path] = checkpoints_in(folder / "made")
    return path


def callback_key(checkpoint: dict, name: str) -> str:
    [key] = [k for k in checkpoint["callbacks"] if k.startswith(name)]
    return key


def test_a_normal_checkpoint_holds_plain_state_and_resumes(checkpoint, tmp_path, config_factory):
    loaded = torch.load(checkpoint, weights_only=True)
    assert_plain(loaded["callbacks"][callback_key(loaded, "RunCheckpoints")])
    assert_plain(loaded["callbacks"][callback_key(loaded, "HealthMonitor")])
    _, trainer = train(config(config_factory, tmp_path, "resumed", 2, **{"trainer.resume": str(checkpoint)}))
    assert trainer.global_step == 2


def plant(checkpoint: dict, where: str, value) -> None:
    if where == "top level":
        checkpoint["payload"] = value
    elif where == "rng state":
        checkpoint["callbacks"][callback_key(checkpoint, "RunCheckpoints")]["rng"]["numpy"]["keys"] = value
    elif where == "health state":
        checkpoint["callbacks"][callback_key(checkpoint, "HealthMonitor")]["alerts"] = [value]
    else:  # the async generator's batches in flight
        checkpoint["grpo_rollout"] = {"pending": [{"records": [value]}]}


@pytest.mark.parametrize("where", ["top level", "rng state", "health state", "async state"])
def test_a_checkpoint_holding_code_is_refused_without_running_it(where, checkpoint, tmp_path, config_factory):
    marker = tmp_path / "MARKER"
    pickle.loads(pickle.dumps(Payload(tmp_path / "live")))  # the payload works when unpickled
    assert (tmp_path / "live").exists()
    crafted = torch.load(checkpoint, weights_only=True)
    plant(crafted, where, Payload(marker))
    path = tmp_path / "crafted.ckpt"
    torch.save(crafted, path)

    cfg = config(config_factory, tmp_path, "victim", 2, **{"trainer.resume": str(path)})
    with pytest.raises(CheckpointError) as caught:
        train(cfg)
    message = str(caught.value)
    assert not marker.exists()
    assert message.startswith(f"checkpoint {path} holds objects that are not plain data")
    assert "checkpoints are data, never code" in message and "\n" not in message
    assert "weights_only" not in message and caught.value.__context__ is None


@pytest.mark.parametrize("where", ["rng", "health"])
def test_pickled_state_of_an_older_version_is_refused_unread(where, checkpoint, tmp_path, config_factory):
    marker = tmp_path / "MARKER"
    old = torch.load(checkpoint, weights_only=True)
    blob = pickle.dumps(Payload(marker))  # bytes load under weights_only; the old code unpickled them
    if where == "rng":
        old["callbacks"][callback_key(old, "RunCheckpoints")]["rng"] = {"torch": torch.get_rng_state(), "host": blob}
    else:
        old["callbacks"][callback_key(old, "HealthMonitor")] = {"pickled": blob}
    path = tmp_path / "old.ckpt"
    torch.save(old, path)
    with pytest.raises(CheckpointError, match=rf"^checkpoint {path}: its .* pickled .* checkpoints are data"):
        train(config(config_factory, tmp_path, "victim", 2, **{"trainer.resume": str(path)}))
    assert not marker.exists()


def test_lightning_resumes_with_weights_only(checkpoint, tmp_path, config_factory, monkeypatch):
    """``fit`` asks Lightning for a weights-only load explicitly, whatever torch's default."""
    seen = []
    original = L.Trainer.fit

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(L.Trainer, "fit", spy)
    train(config(config_factory, tmp_path, "spied", 2, **{"trainer.resume": str(checkpoint)}))
    assert seen == [True]


def test_the_cli_refuses_a_checkpoint_holding_code_in_one_line(checkpoint, tmp_path):
    marker = tmp_path / "MARKER"
    crafted = torch.load(checkpoint, weights_only=True)
    plant(crafted, "top level", Payload(marker))
    path = tmp_path / "crafted.ckpt"
    torch.save(crafted, path)
    args = ["trainer.max_steps=2", "rollout.prompts_per_step=2", "algorithm.micro_batch_size=8", "logger=none"]
    args.append(f"trainer.resume={path}")
    command = [sys.executable, "-m", "grpo_lightning.train", *args, f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(command, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line == f"error: checkpoint {path} holds objects that are not plain data " + (
        "(tensors, numbers, strings, lists, dicts), so it is refused: checkpoints are data, never code"
    )
    assert "weights_only" not in result.stderr and "Traceback" not in result.stderr
    assert not marker.exists()
