"""task=dataset and your own rewards: files read with Hugging Face datasets, every bad input
rejected with a message naming the file, the row and the fix (before any model loads), reward
functions written for TRL, reward modules, reasoning-gym's per-dataset options."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import datasets
import pytest
from hydra import compose, initialize_config_dir

from grpo_lightning.build import build_datamodule, build_run
from grpo_lightning.config import ConfigError, RolloutConfig, TrainConfig, validate_config
from grpo_lightning.data.files import DataError
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.models import build_char_tokenizer
from grpo_lightning.rewards import RewardFunctionError, RewardScorer, WeightedReward
from grpo_lightning.rewards.scorer import RewardState
from grpo_lightning.rollout import HFEngine, RolloutGenerator, Sampling
from grpo_lightning.tasks import DatasetTaskConfig
from grpo_lightning.tasks.reasoning_gym import dataset_options
from grpo_lightning.train import CONF_DIR, to_train_config


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dataset_config(path, **task) -> TrainConfig:
    cfg = TrainConfig(task=DatasetTaskConfig(path=str(path), correctness_reward=None, val_fraction=0.0))
    cfg.rollout.prompts_per_step = 1
    for key, value in task.items():
        setattr(cfg.task, key, value)
    return cfg


ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "level": a} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]


# ----------------------------------------------------------------------------- reading files
@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "save_to_disk"])
def test_every_file_kind_gives_the_same_records(tmp_path, kind):
    data = datasets.Dataset.from_list(ROWS)
    path = tmp_path / f"p.{kind}"
    {
        "jsonl": lambda: data.to_json(path),
        "json": lambda: data.to_json(path, lines=False),
        "csv": lambda: data.to_csv(path),
        "parquet": lambda: data.to_parquet(path),
        "save_to_disk": lambda: data.save_to_disk(path),
    }[kind]()
    dm = build_datamodule(dataset_config(path))
    records = sorted(dm.train_records, key=lambda r: r["prompt"])
    assert [r["prompt"] for r in records] == [r["prompt"] for r in ROWS]
    assert [str(r["answer"]) for r in records] == [r["answer"] for r in ROWS]  # csv reads numbers back as ints
    assert [r["level"] for r in records] == [1, 3, 5, 7]


def test_held_out_split_from_val_path_or_val_fraction(tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", ROWS)
    val = write_jsonl(tmp_path / "v.jsonl", ROWS[:1])
    dm = build_datamodule(dataset_config(train, val_path=str(val), correctness_reward="arithmetic_exact"))
    assert len(dm.train_records) == 4 and dm.val_records == [{**ROWS[0]}]
    dm = build_datamodule(dataset_config(train, val_fraction=0.5, correctness_reward="arithmetic_exact"))
    assert len(dm.train_records) == 2 and len(dm.val_records) == 2
    assert {r["prompt"] for r in dm.train_records + dm.val_records} == {r["prompt"] for r in ROWS}


# ----------------------------------------------------------------------------- bad data
@pytest.mark.parametrize(
    "rows, overrides, message",
    [
        ([{"question": "1+1="}], {}, r"has no column 'prompt' \(task.prompt_column\); its columns are \['question'\]"),
        ([{"q": "1+1="}], {"prompt_column": "question"}, r"has no column 'question'.*its columns are \['q'\]"),
        (
            [{"prompt": "1+1="}, {"prompt": "  "}],
            {},
            r"p.jsonl row 1: column 'prompt' is empty; give every row a prompt, or drop the row",
        ),
        (
            [{"prompt": "1+1="}, {"prompt": "what is 1+1?"}],
            {},
            r"p.jsonl row 1: the tokenizer cannot encode the characters \['a', 'h', 'i', 's', 't', 'w'\] of prompt 'what is 1\+1\?' \(it would turn them into '<pad>'\); remove them",
        ),
        (
            [{"prompt": "1" * 125}],
            {},
            r"p.jsonl row 0: the prompt '1111.*' is 125 tokens, more than the model's context minus rollout.max_new_tokens \(124\)",
        ),
        (
            [{"prompt": [{"role": "robot", "content": "hi"}]}],
            {},
            r"p.jsonl row 0: column 'prompt': message .* needs a role in \['system', 'user', 'assistant'\]",
        ),
        (
            [{"prompt": [{"role": "user", "content": "1+1="}]}],
            {},
            r"p.jsonl row 0: the prompt is a list of chat messages but the tokenizer has no chat template",
        ),
        ([{"prompt": 7}], {}, r"row 0: column 'prompt' must be a string or a list of chat messages"),
    ],
)
def test_bad_rows_are_named_with_their_fix(tmp_path, rows, overrides, message):
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(DataError, match=message):
        build_datamodule(dataset_config(path, **overrides))


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(DataError, match=r"task.path='.*nope.jsonl': no such file or folder"):
        build_datamodule(dataset_config(tmp_path / "nope.jsonl"))
    (tmp_path / "p.txt").write_text("1+1=\n")
    with pytest.raises(
        DataError, match=r"unsupported file type '.txt'; use one of \['.csv', '.json', '.jsonl', '.parquet'\]"
    ):
        build_datamodule(dataset_config(tmp_path / "p.txt"))
    cfg = dataset_config("x")
    cfg.task.path = None
    with pytest.raises(ConfigError, match="task=dataset needs task.path=PATH"):
        validate_config(cfg)


@pytest.mark.slow
def test_cli_reports_bad_data_before_loading_a_model(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"question": "1+1="}])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_lightning.train",
            "task=dataset",
            "task.path=p.jsonl",
            "+task.rewards={arithmetic_exact: 1}",
            "model.name_or_path=/does/not/exist",
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=tmp_path,
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "error: task.path='p.jsonl' has no column 'prompt'" in result.stderr  # not a model-loading error


# ----------------------------------------------------------------------------- rewards
def test_reward_modules_register_rewards_and_bad_ones_are_named(tmp_path):
    module = tmp_path / "my_rewards_abc.py"
    module.write_text(
        "from grpo_lightning.rewards import register_reward\n\n"
        "@register_reward('from_my_file')\ndef f(prompts, completions, **_):\n    return [1.0] * len(completions)\n"
    )
    cfg = TrainConfig()
    cfg.task.reward_modules = [str(module)]
    cfg.task.rewards = {"from_my_file": 1.0}
    validate_config(cfg)
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    cfg.task.reward_modules = [str(tmp_path / "missing.py"), str(broken), "no.such.module"]
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    text = str(err.value)
    assert "task.reward_modules: 'no.such.module' is neither a file nor an importable module" in text
    assert "missing.py' is neither a file nor an importable module" in text
    assert (
        "importing '" in text
        and "broken.py' raised ModuleNotFoundError: No module named 'not_a_module_anywhere'" in text
    )


def test_trl_style_reward_functions_work_unchanged():
    seen = {}

    def exact(prompts, completions, answer, completion_ids, trainer_state):  # no **kwargs: gets only these
        seen["ids"], seen["step"] = completion_ids, trainer_state.global_step
        return [float(c == a) for c, a in zip(completions, answer, strict=True)]

    started = asyncio.Event()

    async def waits(prompts, completions, **kwargs):  # awaits the other one: only concurrent runs finish
        await asyncio.wait_for(started.wait(), timeout=5)
        return [None, 1.0, 2.0]

    async def starts(prompts, completions, **kwargs):
        started.set()
        return [0.5, None, 0.5]

    scorer = RewardScorer(
        [WeightedReward("exact", exact), WeightedReward("waits", waits, 2.0), WeightedReward("starts", starts)]
    )
    total, parts = scorer(
        ["a", "b", "c"],
        ["1", "2", "3"],
        {"answer": ["1", "0", "3"], "level": [1, 2, 3]},
        completion_ids=[[1], [2], [3]],
        trainer_state=RewardState(global_step=7),
    )
    assert seen == {"ids": [[1], [2], [3]], "step": 7}
    assert total.tolist() == [1.0 + 0.5, 0.0 + 2.0, 1.0 + 4.0 + 0.5]  # None skipped in the weighted sum
    assert parts["waits"][0].isnan() and parts["starts"][1].isnan()


def test_reward_errors_name_the_function_sample_and_prompt():
    scorer = RewardScorer(
        [WeightedReward("a", lambda p, c, **_: [None, 1.0]), WeightedReward("b", lambda p, c, **_: [None, 2.0])]
    )
    with pytest.raises(
        RewardFunctionError,
        match=r"no reward function applies to sample 0 \(prompt 'first'\): \['a', 'b'\] all returned None",
    ):
        scorer(["first", "second"], ["x", "y"], {})
    scorer = RewardScorer([WeightedReward("inf", lambda p, c, **_: [1.0, float("inf")])])
    with pytest.raises(
        RewardFunctionError,
        match=r"'inf' returned non-finite values at completions \[1\] \(sample 1: prompt 'second'\)",
    ):
        scorer(["first", "second"], ["x", "y"], {})


def test_chat_message_prompts_use_the_chat_template_and_rewards_get_messages(policy):
    tok = build_char_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}={% endif %}"
    )
    seen = {}

    def record(prompts, completions, **_):
        seen["prompts"], seen["completions"] = prompts, completions
        return [0.0] * len(completions)

    generator = RolloutGenerator(
        engine=HFEngine(policy, tok.pad_token_id, tok.eos_token_id),
        tokenizer=tok,
        scorer=RewardScorer([WeightedReward("record", record)]),
        num_generations=2,
        sampling=Sampling.from_config(RolloutConfig(max_new_tokens=3)),
        formatter=PromptFormatter(tok, system_prompt="1"),
    )
    messages = [{"role": "user", "content": "2+3"}]
    batch = generator.generate([{"prompt": messages}], step=0, rank=0)
    assert seen["prompts"] == [messages, messages]
    assert seen["completions"] == [[{"role": "assistant", "content": c}] for c in batch.completions]
    assert batch.prompts[0] == "12+3="  # the system prompt first, then the template's generation prompt


# ----------------------------------------------------------------------------- reasoning-gym
@pytest.mark.parametrize("dataset", ["chain_sum", "countdown", "basic_arithmetic"])
def test_every_reasoning_gym_dataset_in_the_readme_builds_from_the_cli_config(dataset):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        # As the README runs them: with SmolLM2 (the tiny model's alphabet cannot write these
        # prompts, and the prompt check says so before any model loads).
        overrides = [
            "trainer.output_dir=out",
            "model=smollm2_135m",
            "task=reasoning_gym",
            f"task.dataset={dataset}",
            "task.size=40",
        ]
        cfg = to_train_config(compose(config_name="train", overrides=overrides))
    dm = build_datamodule(cfg)
    assert dm.train_records and all(r["entry"]["metadata"]["source_dataset"] == dataset for r in dm.train_records)


def test_reasoning_gym_unknown_dataset_or_option_lists_the_valid_ones():
    with pytest.raises(
        DataError, match=r"task.dataset='chain_sums' is not a reasoning-gym dataset; choose one of \[.*'chain_sum'"
    ):
        dataset_options("chain_sums")
    with pytest.raises(
        DataError,
        match=r"\['operators'\] are not options of reasoning-gym's 'chain_sum'; its options are \['min_terms'",
    ):
        dataset_options("chain_sum", {"operators": ["+"]})
    assert dataset_options("basic_arithmetic", {"max_terms": 3})["max_terms"] == 3
    assert dataset_options("countdown") == {}


@pytest.mark.slow
def test_long_prompts_are_cut_to_their_last_tokens_when_asked(tmp_path):
    """task.truncate_prompts: the count is reported and the generator sees the last tokens."""
    rows = [{"prompt": "1" * 125 + "2+3=", "answer": "5"}] + ROWS
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    cfg = dataset_config(path, truncate_prompts=True)
    cfg.algorithm.micro_batch_size = 8
    with pytest.warns(
        UserWarning,
        match=r"1 of 5 prompts are longer than the model's context minus rollout.max_new_tokens \(124 tokens\); task.truncate_prompts=true keeps their last 124 tokens",
    ):
        run = build_run(cfg)
    ids = run.module.rollout.tokenize_prompt(rows[0]["prompt"])
    assert len(ids) == 124 and run.tokenizer.decode(ids).endswith("2+3=")


def test_every_task_is_checked_against_the_tokenizer(monkeypatch):
    """The built-in tasks go through the same check: a character outside the tiny model's
    alphabet stops the run before the model loads instead of becoming padding."""
    cfg = TrainConfig()
    cfg.model.tiny.alphabet = "0123456789=? "  # no '+': the sums cannot be written
    with pytest.raises(
        DataError,
        match=r"task=arithmetic \(training prompts\) row 0: the tokenizer cannot encode the characters \['\+'\]",
    ):
        build_datamodule(cfg)
