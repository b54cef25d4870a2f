"""Issue 46, silent failure 2: a sandboxed program could write to /run/lock (world-writable, on the
root disk) and its files stayed there, run after run. Now a program writes into every
world-writable folder of this machine, its home, /tmp and a few folders of its own choosing, and
nothing of it is left anywhere; nor can it read a run's output folder, even one inside a folder
it is shown."""

from __future__ import annotations

import os
import uuid

import pytest

from grpo_lightning.rewards.sources import sandbox
from grpo_lightning.rewards.sources.sandbox import Limits, isolation_available, run_python, world_writable_dirs

pytestmark = pytest.mark.xdist_group("sandbox")

FIXED = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/", "/usr", "/etc"]


def writer(targets: list[str], tag: str) -> str:
    return (
        "import os\n"
        f"targets = {targets!r} + [os.environ['HOME'], os.getcwd()]\n"
        "for folder in targets:\n"
        "    for i in range(3):\n"
        "        try:\n"
        f"            open(os.path.join(folder, '{tag}-%d' % i), 'w').write('x' * 4096)\n"
        "        except OSError:\n"
        "            pass\n"
        "print('done')\n"
    )


def leftovers(tag: str) -> list[str]:
    found = []
    for folder in {*world_writable_dirs(), *FIXED}:
        try:
            found += [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith(tag)]
        except OSError:
            continue
    return found


@pytest.mark.parametrize("isolate", [True, False], ids=["isolated", "unisolated_as_root"])
def test_no_write_outside_the_scratch_persists(isolate):
    if isolate and not isolation_available():
        pytest.skip("no namespaces on this machine")
    if not isolate and os.geteuid() != 0:
        pytest.skip("without namespaces and root the program runs as you: docs/security.md")
    tag = f"sandbox-leak-{uuid.uuid4().hex[:8]}"
    targets = sorted({*world_writable_dirs(), *FIXED})
    result = run_python(writer(targets, tag), limits=Limits(isolate=isolate, wall_s=10.0))
    assert result.ok and result.stdout == "done\n", result
    left = leftovers(tag)
    for path in left:
        os.remove(path)
    assert left == []


def test_a_runs_output_folder_is_never_shown(tmp_path, monkeypatch):
    if not isolation_available():
        pytest.skip("no namespaces on this machine")
    shown = tmp_path / "shared"
    run_dir = shown / "runs" / "x"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_1.ckpt").write_text("weights")
    (shown / "notes.txt").write_text("visible")
    for folder in (tmp_path, shown, shown / "runs", run_dir, run_dir / "checkpoints"):
        os.chmod(folder, 0o755)
    monkeypatch.setattr(sandbox, "_PRIVATE", set())
    sandbox.keep_private(run_dir)  # build.py does this with trainer.output_dir
    code = (
        f"for path in ({str(shown / 'notes.txt')!r}, {str(run_dir / 'checkpoints' / 'step_1.ckpt')!r}):\n"
        "    try:\n        print(open(path).read())\n"
        "    except OSError as err:\n        print(type(err).__name__)\n"
    )
    shown_but_private = run_python(code, limits=Limits(visible=(str(shown),), hide=sandbox.private_paths()))
    assert shown_but_private.stdout.split() == ["visible", "PermissionError"]
    assert run_python(code, limits=Limits()).stdout.split() == ["FileNotFoundError"] * 2  # by default: not there
