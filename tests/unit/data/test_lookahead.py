"""The lookahead loader gives every step the prompts it gets in sync mode, plus the next ones."""

from __future__ import annotations

from grpo_lightning.data import PromptDataModule
from grpo_lightning.data.lookahead import LookaheadLoader, PromptWindow, current_records


def test_windows_carry_the_next_batches_in_order():
    windows = list(LookaheadLoader([[1], [2], [3], [4]], lookahead=2))
    assert [w.current for w in windows] == [[1], [2], [3], [4]]
    assert [w.ahead for w in windows] == [[[2], [3]], [[3], [4]], [[4]], []]
    assert len(LookaheadLoader([[1], [2]], lookahead=1)) == 2


def test_async_datamodule_yields_the_sync_batches():
    records = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]
    sync = list(PromptDataModule(records, prompts_per_step=3, seed=7, num_batches=5).train_dataloader())
    windows = list(PromptDataModule(records, prompts_per_step=3, seed=7, num_batches=5, lookahead=1).train_dataloader())
    assert all(isinstance(w, PromptWindow) for w in windows)
    assert [current_records(w) for w in windows] == sync
    assert [w.ahead for w in windows[:-1]] == [[b] for b in sync[1:]]
    assert current_records(sync[0]) == sync[0]
