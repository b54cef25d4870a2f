"""A second run in a busy folder must leave the live run's files alone (issue 46, silent failure 7):
the lock is taken before Hydra writes ``.hydra/`` and ``train.log``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from grpo_lightning import train

HOLD = (
    "import sys, time; from grpo_lightning.runtime.run_lock import RunLock; RunLock(sys.argv[1]).acquire(); "
    "print('held', flush=True); time.sleep(60)"
)


@pytest.fixture
def busy_folder(tmp_path):
    """A run folder whose lock another live process holds, with that run's files in it."""
    folder = tmp_path / "live"
    (folder / ".hydra").mkdir(parents=True)
    files = {
        folder / ".hydra" / "config.yaml": b"the live run's config\n",
        folder / ".hydra" / "overrides.yaml": b"- the live run's overrides\n",
        folder / ".hydra" / "hydra.yaml": b"the live run's hydra\n",
        folder / "train.log": b"the live run's log\n",
    }
    for path, content in files.items():
        path.write_bytes(content)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    yield folder, files, holder.pid
    holder.send_signal(signal.SIGKILL)
    holder.wait()


def test_a_second_run_in_a_busy_folder_writes_nothing_there(busy_folder, monkeypatch, capsys):
    folder, files, pid = busy_folder
    monkeypatch.setattr(
        sys, "argv", ["grpo-lightning", "logger=none", "trainer.max_steps=1", f"hydra.run.dir={folder}"]
    )
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop:
        train.cli()
    err = capsys.readouterr().err
    assert stop.value.code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and f"PID {pid}" in err, err
    assert {path: path.read_bytes() for path in files} == files
    assert sorted(p.name for p in folder.rglob("*")) == sorted([".hydra", ".run.lock", *(p.name for p in files)])


def test_the_cli_locks_the_folder_hydra_writes_into(monkeypatch, tmp_path):
    """The default run folder (outputs/<date>/<time>) is resolved once: the lock and .hydra share it."""
    seen = {}

    def stop_in_main(cfg, logged_config=None):
        seen["output_dir"] = cfg.trainer.output_dir
        raise train.Interrupted(signal.SIGTERM)

    monkeypatch.setattr(train, "run", stop_in_main)
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", "logger=none", "trainer.max_steps=1"])
    with pytest.raises(SystemExit):
        train.cli()
    (lock,) = (tmp_path / "outputs").rglob(".run.lock")
    assert lock.parent == (tmp_path / seen["output_dir"]).resolve() and (lock.parent / ".hydra").is_dir()
    assert os.path.getsize(lock) == 0  # released when the command line returned
