"""task=key_lookup runs from the command line as the README writes it, on the default tiny model: its
task defaults for that model (digit keys, a prompt in its alphabet) apply, and nothing is warned about."""

from __future__ import annotations

import pytest
from test_cli import read_metrics, train  # the CLI as a user runs it (same folder)

pytestmark = pytest.mark.slow


def test_key_lookup_trains_from_the_cli_as_the_readme_writes_it(tmp_path):
    # README: `grpo-lightning task=key_lookup` (here two steps, CSV metrics, a folder of the test's)
    result = train(
        "task=key_lookup", "trainer.max_steps=2", "logger=csv", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout + result.stderr
    assert "warn" not in printed.lower(), printed[-3000:]
    assert "task.key_style='digits'  (task=key_lookup's default for tiny)" in printed
    rows = [row for row in read_metrics(tmp_path / "run") if row.get("reward/mean")]
    assert len(rows) == 2
    assert float(rows[0]["rollout/episodes/count"]) == 16 * 8  # prompts x generations, none dropped
    assert float(rows[0]["rollout/episodes/turns"]) >= 1 and "reward/environment/mean" in rows[0]
    assert float(rows[0]["rollout/episodes/failed"]) == 0
