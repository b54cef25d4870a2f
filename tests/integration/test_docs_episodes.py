"""docs/environments.md's examples run as written: each Python block that starts with ``# <file>.py``
is written to that file, and each bash block that follows runs verbatim in the same folder, the
console scripts the package installs on the PATH. A user's environment file plus a jsonl trains
and evaluates from the CLI (``task=episodes``): ``val/*`` before and after training in
metrics.csv, summary.json and report.png, and the episodes turn by turn in completions.jsonl."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

pytestmark = pytest.mark.slow  # two short CLI runs (the docs' own commands)
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "environments.md"


def examples(text: str) -> list[tuple[str, str]]:
    """(file name, Python source) and ("bash", script) blocks in the page's order, the files named by
    their first line."""
    found = []
    for lang, body in re.findall(r"```(python|bash)\n(.*?)```", text, re.S):
        first = body.splitlines()[0]
        if lang == "python" and re.fullmatch(r"# \w+\.py", first):
            found.append((first[2:], body))
        elif lang == "bash" and found and found[-1][0] != "bash":  # the commands right after a file
            found.append(("bash", body))
    return found


def run_bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    scripts = Path(sys.executable).parent  # grpo-lightning and grpo-lightning-eval of the package under test
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env["PATH"] = f"{scripts}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["bash", "-e", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_echo_environment_trains_and_evaluates_from_the_cli_as_the_docs_write_it(tmp_path):
    blocks = examples(DOC.read_text())
    names = [name for name, _ in blocks]
    assert names[:2] == ["echo_env.py", "bash"], names
    (tmp_path / "echo_env.py").write_text(blocks[0][1])
    result = run_bash(blocks[1][1], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "echo"
    (metrics,) = run.glob("csv/version_*/metrics.csv")
    val = [row for row in csv.DictReader(metrics.open()) if row.get("val/reward")]
    assert len(val) == 2  # before training and after its last step
    for row in val:
        assert 0 <= float(row["val/success"]) <= 1 and float(row["val/turns"]) >= 1
        assert sum(float(v) for k, v in row.items() if k.startswith("val/stop/") and v) == pytest.approx(1.0)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["held_out"]["before"]["step"] == 0 and summary["held_out"]["after"]["step"] == 10
    assert summary["held_out"]["after"]["val/reward"] == pytest.approx(float(val[-1]["val/reward"]))
    assert (run / "report.png").stat().st_size > 10_000
    check_turns(run)
    # grpo-lightning-eval on the trained run plays the same held-out games: the after row again
    table = result.stdout.splitlines()
    row = next(line for line in table if line.startswith("all"))
    assert float(row.split()[2]) == pytest.approx(summary["held_out"]["after"]["val/reward"], abs=1e-4)


def check_turns(run: Path) -> None:
    """completions.jsonl holds each episode turn by turn, and its mask-1 ids are what the environment
    read: Echo rewards each turn len(text) / 10, the text it was handed (the sampled ids decoded)."""
    tokenizer = AutoTokenizer.from_pretrained(run / "hf" / "final")
    records = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert records
    for record in records:
        turns = record["turns"]
        assert turns[0]["role"] == "prompt" and turns[0]["loss_mask"] == 0
        sampled = [turn for turn in turns if turn["role"] == "assistant"]
        assert len(sampled) == record["num_turns"] >= 1 and record["stop_reason"] in ("done", "max_turns", "context")
        assert all(turn["loss_mask"] == (turn["role"] == "assistant") for turn in turns)
        assert all(turn["text"] == tokenizer.decode(turn["tokens"]) for turn in turns)
        read = [len(tokenizer.decode(turn["tokens"], skip_special_tokens=True)) / 10 for turn in sampled]
        assert record["step_rewards"] == pytest.approx(read)
