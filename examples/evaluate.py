"""Held-out accuracy of a model on a task, without training: the baseline before a GRPO run.

    python examples/evaluate.py model=smollm2_135m task=gsm eval.num_prompts=20 eval.max_new_tokens=256

Takes the CLI's Hydra overrides; prints val/accuracy (and val/pass@k with eval.pass_k=k)
and a few greedy answers.
"""

from __future__ import annotations

import sys
import time

from hydra import compose, initialize_config_dir

from grpo_lightning.build import build_run
from grpo_lightning.train import CONF_DIR, to_train_config


def main(overrides: list[str]) -> None:
    if {"-h", "--help"} & set(overrides):
        print(__doc__)
        return
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = to_train_config(
            compose(config_name="train", overrides=["logger=none", "trainer.output_dir=outputs/evaluate", *overrides])
        )
    start = time.perf_counter()
    run = build_run(cfg)
    metrics = run.trainer(cfg).validate(run.module, datamodule=run.datamodule, verbose=False)[0]
    print({k: round(v, 4) for k, v in metrics.items()}, f"({time.perf_counter() - start:.0f} s)")
    for sample in run.module.evaluator.last_samples[:5]:
        print(
            ("ok  " if sample["correct"] else "bad ") + repr(sample["completion"][-160:]), "| answer", sample["answer"]
        )


if __name__ == "__main__":
    main(sys.argv[1:])
