"""The README's Python examples run as written (a README that is true)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_block_runs(index, tmp_path):
    assert len(BLOCKS) >= 3
    script = tmp_path / "example.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + BLOCKS[index])
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "WANDB_MODE": "offline",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            # the checkout under test, when it is not the installed one (PYTHONPATH=$PWD pytest ...)
            **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ},
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]
