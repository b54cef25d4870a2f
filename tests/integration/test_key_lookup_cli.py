"""task=key_lookup trains from the command line with the tiny in-code model (digit keys: its alphabet)."""

from __future__ import annotations

import pytest
from test_cli import read_metrics, train  # the CLI as a user runs it (same folder)

pytestmark = pytest.mark.slow


def test_key_lookup_trains_from_the_cli_and_logs_episode_metrics(tmp_path):
    result = train(
        "task=key_lookup",
        "task.question='{key}?'",
        "task.key_style=digits",
        "task.tools_in_system_prompt=false",
        "task.one_shot=false",
        "task.num_keys=20",
        "trainer.max_steps=2",
        "rollout.prompts_per_step=2",
        "algorithm.micro_batch_size=16",
        "logger=csv",
        f"hydra.run.dir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [row for row in read_metrics(tmp_path / "run") if row.get("reward/mean")]
    assert len(rows) == 2
    assert float(rows[0]["rollout/episodes/count"]) == 2 * 8  # prompts x generations, none dropped
    assert float(rows[0]["rollout/episodes/turns"]) >= 1 and "reward/environment/mean" in rows[0]
