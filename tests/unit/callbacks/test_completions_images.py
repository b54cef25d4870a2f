"""completions.jsonl and the wandb table say which images each prompt had (paths or pixel hashes), and
the wandb table shows the first one."""

from __future__ import annotations

import json

import torch
import wandb
from PIL import Image
from test_run_report import four_completions

from grpo_lightning.callbacks.completions_table import completion_rows, with_pictures
from grpo_lightning.callbacks.run_report import RunReport
from grpo_lightning.records import VisionInputs


def two_prompts_with_images() -> list:
    first = VisionInputs("aa", ["/data/cat.png"], {}, 4, [Image.new("RGB", (4, 4), (255, 0, 0))])
    second = VisionInputs("bb|cc", ["sha:bb", "sha:cc"], {}, 8, [Image.new("RGB", (4, 4)), Image.new("RGB", (2, 2))])
    return [first, first, second, second]


def test_completions_jsonl_records_each_prompts_images(tmp_path):
    batch = four_completions(rewards=torch.zeros(4), vision=two_prompts_with_images())
    report = RunReport(tmp_path, every_n_steps=1, max_rows=4, draw=False)
    report.write_samples(batch, torch.zeros(4))
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [r["images"] for r in rows] == [["/data/cat.png"]] * 2 + [["sha:bb", "sha:cc"]] * 2


def test_the_wandb_table_shows_the_first_image():
    batch = four_completions(rewards=torch.zeros(4), vision=[*two_prompts_with_images()[:2], None, None])
    columns, rows = with_pictures(batch, *completion_rows(batch, torch.zeros(4), 4))
    assert columns[-2:] == ["images", "image"]
    assert isinstance(rows[0][-1], wandb.Image) and rows[0][-2] == ["/data/cat.png"]
    assert rows[2][-1] is None and rows[2][-2] == []
    text_only = four_completions(rewards=torch.zeros(4))
    assert with_pictures(text_only, *completion_rows(text_only, torch.zeros(4), 4))[0][-1] == "advantage"
