"""Train on a verifiers 0.4 environment: its episodes, played against the policy, as the step's batch.

``VerifiersRollout`` takes the place of a task's episode rollout (``generator.episodes``): for each
step it serves the policy's engine on the token-in endpoint (:class:`GenerateServer`), asks the
driver (``verifiers_driver.py``, a long-lived process in the verifiers venv) to play G episodes
of each record's verifiers task, and turns their traces into the batch
(:func:`traces_to_batch`): the ids the engine sampled, their mask and log-probs, verifiers'
reward. The driver's first episode installs the harness script's packages with ``uv``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_lightning.environments.adapters.verifiers import GenerateServer
from grpo_lightning.environments.adapters.verifiers_traces import traces_to_batch
from grpo_lightning.records import RolloutBatch

DRIVER = Path(__file__).with_name("verifiers_driver.py")


class VerifiersRollout:
    """Episodes of the verifiers taskset ``taskset`` (its tasks chosen by ``task_index(record)``).

    ``python`` is the verifiers venv's interpreter (its ``bin`` goes first on the driver's PATH,
    where the harness finds ``uv``); ``tokenizer_dir`` the policy's tokenizer, saved, which the
    client renders with; ``paths`` folders the taskset is imported from. Use ``close()`` at the end."""

    def __init__(
        self,
        python: str,
        taskset: str,
        tokenizer_dir: str,
        task_index: Callable[[dict[str, Any]], int],
        max_tokens: int,
        paths: tuple[str, ...] = (),
        harness: str = "null",
        failed_reward: float = 0.0,
    ):
        self.python, self.taskset, self.tokenizer_dir, self.task_index = python, taskset, tokenizer_dir, task_index
        self.max_tokens, self.paths, self.harness, self.failed_reward = max_tokens, paths, harness, failed_reward
        self.server: GenerateServer | None = None
        self.driver: subprocess.Popen | None = None
        self.last_records: list[dict[str, Any]] = []

    def _start(self, generator: Any) -> None:
        self.server = GenerateServer(generator.engine, generator.sampling, seed=generator.seed).__enter__()
        command = [self.python, str(DRIVER), self.server.url, self.tokenizer_dir, self.taskset]
        command += [f"--path={p}" for p in self.paths] + [
            f"--harness={self.harness}",
            f"--max-tokens={self.max_tokens}",
        ]
        env = dict(os.environ, PATH=f"{Path(self.python).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        self.driver = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def rollout(self, generator: Any, records: list[dict], step: int, rank: int) -> RolloutBatch:
        if self.driver is None:
            self._start(generator)
        start = time.perf_counter()
        g = generator.num_generations
        tasks = [self.task_index(record) for record in records for _ in range(g)]
        self.driver.stdin.write(json.dumps({"tasks": tasks, "temperature": generator.sampling.temperature}) + "\n")
        self.driver.stdin.flush()
        line = self.driver.stdout.readline()
        if not line:
            raise RuntimeError(f"the verifiers driver exited (code {self.driver.poll()}); its errors are above")
        episodes = json.loads(line)
        if any(len(traces) != 1 for traces in episodes):
            raise RuntimeError("a verifiers episode gave no trace or several; one episode must be one sample")
        self.last_records = [traces[0] for traces in episodes]
        batch = traces_to_batch(
            self.last_records,
            g,
            generator.tokenizer.pad_token_id,
            self.max_tokens,
            generator.sampling.temperature,
            step,
            self.failed_reward,
        )
        batch.timing["rollout/seconds"] = time.perf_counter() - start
        return batch

    def close(self) -> None:
        if self.driver is not None:
            self.driver.stdin.close()
            try:
                self.driver.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.driver.kill()
            self.driver = None
        if self.server is not None:
            self.server.__exit__(None, None, None)
            self.server = None
