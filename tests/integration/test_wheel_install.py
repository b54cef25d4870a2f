"""Installable like a library: the wheel ships the configs and the `grpo-lightning` CLI works from anywhere.

Builds the wheel from a copy of the sources (so no build/ or egg-info lands in the repository),
installs it WITHOUT -e and without dependencies into a fresh venv, and makes this venv's
dependencies importable through a ``deps.pth`` file: a path listed in a .pth file joins
sys.path, but the .pth files inside it (this venv's ``__editable__*.pth``) are not processed,
so ``grpo_lightning`` resolves to the wheel and nothing reads the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "trainer.max_steps=3",
    "logger=none",
    "rollout.prompts_per_step=4",
    "rollout.num_generations=4",
    "algorithm.micro_batch_size=16",
    "eval.num_prompts=4",
    "eval.before_training=false",
]


def run(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{args}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv folder, environment for its commands, a working folder outside the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "grpo_lightning", src / "grpo_lightning", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "-w",
        tmp / "dist",
        src,
        cwd=tmp,
    )
    (wheel,) = (tmp / "dist").glob("grpo_lightning-*.whl")

    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "WANDB_API_KEY")}
    env.update(WANDB_SILENT="true", WANDB_MODE="offline")
    # Without PYTHONPATH: a checkout on it with an editable install's egg-info looks installed to pip.
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--quiet", wheel, cwd=tmp, env=env)
    site = run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp, env=env
    ).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp / "work"
    work.mkdir()
    return venv, env, work


def test_the_package_and_its_configs_come_from_the_wheel(installed):
    venv, env, work = installed
    out = run(
        venv / "bin" / "python",
        "-c",
        "import grpo_lightning, grpo_lightning.train as t; print(grpo_lightning.__file__); print(t.CONF_DIR)",
        cwd=work,
        env=env,
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in out), out
    assert (Path(out[1]) / "train.yaml").is_file() and (Path(out[1]) / "task" / "gsm.yaml").is_file()


def test_cli_prints_the_composed_config(installed):
    venv, env, work = installed
    out = run(venv / "bin" / "grpo-lightning", "--cfg", "job", cwd=work, env=env).stdout
    assert "algorithm:" in out and "rollout:" in out and "arithmetic_exact: 0.5" in out


def test_cli_finds_options_of_a_users_config_dir(installed):
    """The README's --config-dir example: a user's task option that starts from a shipped one."""
    venv, env, work = installed
    (work / "my_conf" / "task").mkdir(parents=True)
    (work / "my_conf" / "task" / "sums99.yaml").write_text("defaults:\n  - arithmetic\n  - _self_\nmax_operand: 99\n")
    out = run(
        venv / "bin" / "grpo-lightning", "--config-dir", "my_conf", "task=sums99", "--cfg", "job", cwd=work, env=env
    ).stdout
    assert "max_operand: 99" in out and "arithmetic_close: 0.5" in out


def test_cli_trains_three_steps(installed):
    venv, env, work = installed
    result = run(venv / "bin" / "grpo-lightning", *SMALL, f"hydra.run.dir={work}/run", cwd=work, env=env)
    assert "final metrics: {" in result.stdout and "reward/mean" in result.stdout
