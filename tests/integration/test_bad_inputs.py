"""One clear line for every bad input (issue 27): the CLI entry point, in this process, over many
inputs a user gets wrong. Each must end with exit code 2, at most three lines on stderr that name
the field, file, row or function, no traceback, nothing written under the run folder that looks
like a checkpoint, and (all of these fail before training starts) within a few seconds."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from grpo_lightning import build, train
from grpo_lightning.config import TrainConfig
from grpo_lightning.data.rows import check_text_file
from grpo_lightning.errors import ConfigError, DataError
from grpo_lightning.models import memory, source
from grpo_lightning.rewards.columns import required_columns
from tests.helpers.tiny_reward_model import save_tiny_causal_lm

# Its module fixture only writes small files: the cases may run on every xdist worker.
pytestmark = pytest.mark.spread_over_workers

FAIL_FAST_S = 10.0
# Every case fails before training; reaching fit means the input was not caught.
BASE = ("logger=none", "trainer.max_steps=2")


def write_files(root: Path) -> dict[str, str]:
    """The bad data, plug-in and checkpoint files, written once for the module."""
    good = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]
    files: dict[str, bytes | str] = {
        "good.jsonl": "\n".join(json.dumps(r) for r in good) + "\n",
        "empty.jsonl": "",
        "empty.csv": "",
        "blank_lines.jsonl": "\n\n\n",
        "malformed.jsonl": '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": \n',
        "not_utf8.jsonl": b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=\xff\xfe", "answer": "4"}\n',
        "not_utf8.csv": b"prompt,answer\n1+1=,2\n2+2=\xff,4\n",
        "extra_field.csv": "prompt,answer\n1+1=,2\n2+2=,4,5\n",
        "missing_field.csv": "prompt,answer\n1+1=,2\n\n2+2=\n",
        "open_quote.csv": 'prompt,answer\n1+1=,2\n"2+2=,4\n3+3=,6\n',
        "mixed.jsonl": '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2=", "answer": 4}\n'
        '{"prompt": "3+3=", "answer": [6]}\n',
        "no_answer.jsonl": '{"prompt": "1+1="}\n{"prompt": "2+2="}\n',
        "no_prompt.jsonl": '{"question": "1+1=", "answer": "2"}\n',
        "blank_prompt.jsonl": '{"prompt": "1+1=", "answer": "2"}\n{"prompt": "  ", "answer": "4"}\n',
        "number_prompt.jsonl": '{"prompt": 12, "answer": "2"}\n',
        "bad_chat.jsonl": '{"prompt": [{"role": "robot", "content": "hi"}], "answer": "2"}\n',
        "bad_chars.jsonl": '{"prompt": "1+1=\\u00e9\\u4e2d", "answer": "2"}\n',
        "prompts.txt": "1+1=\n",
        "syntax_error.py": "def broken(:\n",
        "raises.py": "raise RuntimeError('plug-in refuses to load')\n",
        "bad_register.py": "from grpo_lightning.rewards import register_reward\nregister_reward('answer_format')(len)\n",
        "garbage.ckpt": b"\x00not a checkpoint\x13" * 10,
        "text.ckpt": "hello\n",
    }
    for name, content in files.items():
        path = root / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    (root / "not_a_dataset").mkdir()
    (root / "not_a_dataset" / "x.txt").write_text("x")
    (root / "ckpt_dir.ckpt").mkdir()
    return {name: str(root / name) for name in [*files, "not_a_dataset", "ckpt_dir.ckpt"]}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return write_files(tmp_path_factory.mktemp("bad_inputs"))


def fill(args: tuple[str, ...], files: dict[str, str]) -> tuple[str, ...]:
    """``<name>`` in an override becomes the path of that file of ``write_files``."""
    return tuple(re.sub(r"<([^<>]+)>", lambda m: files[m.group(1)], a) for a in args)


def dataset(path: str, *more: str) -> tuple[str, ...]:
    return (
        "task=dataset",
        f"task.path={path}",
        "+task.rewards={arithmetic_exact: 1.0}",
        "rollout.prompts_per_step=1",
        *more,
    )


# (case id, overrides (``{name}`` is a file of ``write_files``), words stderr must contain)
CASES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    # unknown keys, with and without +
    ("unknown_key", ("algorithm.betaa=1",), ("algorithm.betaa",)),
    ("unknown_key_plus", ("+algorithm.betaa=1",), ("algorithm.betaa",)),
    ("unknown_group_key", ("rollout.num_generation=4",), ("rollout.num_generation", "num_generations")),
    ("unknown_top_key", ("+foo=1",), ("foo",)),
    ("unknown_nested_key", ("+rollout.vllm.server.portt=1",), ("portt",)),
    ("other_tasks_key", ("task=dataset", "task.max_operand=3"), ("task.max_operand",)),
    ("unknown_health_key", ("health.diversity.patiense=3",), ("patiense",)),
    # wrong types
    ("str_for_float", ("algorithm.lr=fast",), ("algorithm.lr", "fast")),
    ("str_for_int", ("rollout.num_generations=many",), ("rollout.num_generations", "many")),
    ("quoted_number", ("rollout.prompts_per_step='1e3'",), ("rollout.prompts_per_step", "1e3")),
    ("exponent_for_int", ("rollout.prompts_per_step=1e3",), ("rollout.prompts_per_step", "1e3")),
    ("float_for_int", ("trainer.max_steps=2.5",), ("trainer.max_steps", "2.5")),
    ("str_for_bool", ("algorithm.pack_sequences=maybe",), ("algorithm.pack_sequences", "maybe")),
    ("list_for_int", ("rollout.max_new_tokens=[1,2]",), ("rollout.max_new_tokens",)),
    ("dict_for_float", ("algorithm.beta={a: 1}",), ("algorithm.beta",)),
    ("bad_reward_weight", ("task.rewards={arithmetic_exact: heavy}",), ("task.rewards", "heavy")),
    ("unparsable_override", ("algorithm.beta=[",), ("algorithm.beta=[",)),
    ("str_for_seed", ("trainer.seed=abc",), ("trainer.seed", "abc")),
    # out-of-range values, every group
    ("negative_beta", ("algorithm.beta=-1",), ("algorithm.beta",)),
    ("zero_lr", ("algorithm.lr=0",), ("algorithm.lr",)),
    ("clip_negative", ("algorithm.clip_low=-0.2",), ("algorithm.clip_low",)),
    ("zero_iterations", ("algorithm.num_iterations=0",), ("algorithm.num_iterations",)),
    ("one_generation", ("rollout.num_generations=1",), ("rollout.num_generations",)),
    ("zero_prompts", ("rollout.prompts_per_step=0",), ("rollout.prompts_per_step",)),
    ("zero_new_tokens", ("rollout.max_new_tokens=0",), ("rollout.max_new_tokens",)),
    ("top_p_above_1", ("rollout.top_p=1.5",), ("rollout.top_p",)),
    ("negative_temperature", ("rollout.temperature=-1",), ("rollout.temperature",)),
    ("zero_steps", ("trainer.max_steps=0",), ("trainer.max_steps",)),
    ("zero_keep", ("trainer.keep_checkpoints=0",), ("trainer.keep_checkpoints",)),
    ("negative_every", ("trainer.checkpoint_every_n_steps=-1",), ("trainer.checkpoint_every_n_steps",)),
    ("val_fraction_above_1", ("task.val_fraction=1.5",), ("task.val_fraction",)),
    ("zero_hidden", ("model.tiny.hidden_size=0",), ("model.tiny.hidden_size",)),
    ("zero_layers", ("model.tiny.num_layers=0",), ("model.tiny.num_layers",)),
    ("bad_health_action", ("health.diversity.action=explode",), ("health.diversity.action", "explode")),
    ("negative_eval_prompts", ("eval.num_prompts=-1",), ("eval.num_prompts",)),
    ("zero_table_rows", ("logger=csv", "logger.table_rows=0"), ("logger.table_rows",)),
    ("public_bind", ("rollout.vllm.server.launch=true", "rollout.vllm.server.host=0.0.0.0"), ("host",)),
    # unknown registry names and choices
    ("unknown_task", ("task=no_such_task",), ("no_such_task",)),
    ("unknown_model_group", ("model=no_such_model",), ("no_such_model",)),
    ("unknown_preset", ("+preset=nope",), ("nope",)),
    ("unknown_policy_loss", ("algorithm.policy_loss=ppo2",), ("algorithm.policy_loss", "ppo2")),
    ("unknown_advantage", ("algorithm.advantage_estimator=magic",), ("algorithm.advantage_estimator", "magic")),
    ("unknown_kl", ("algorithm.kl_estimator=k9",), ("algorithm.kl_estimator", "k9")),
    ("unknown_engine", ("rollout.engine=sglang",), ("rollout.engine", "sglang")),
    ("unknown_strategy", ("trainer.strategy=deepspeed",), ("trainer.strategy",)),
    ("unknown_logger_kind", ("logger.kind=tensorboard",), ("logger.kind", "tensorboard")),
    ("unknown_dtype", ("model.dtype=float8",), ("model.dtype", "float8")),
    ("unknown_operator", ("task.operators=+/",), ("task.operators", "/")),
    # reward names
    (
        "unknown_reward",
        ("task.rewards={arithmetic_exactt: 1.0}",),
        ("task.rewards.arithmetic_exactt", "arithmetic_exact"),
    ),
    ("unknown_correctness", ("task.correctness_reward=nope",), ("task.correctness_reward", "nope")),
    ("dataset_without_path", ("task=dataset", "+task.rewards={arithmetic_exact: 1.0}"), ("task.path",)),
    # numbers that cannot work
    ("tokens_beyond_context", ("rollout.max_new_tokens=100000",), ("rollout.max_new_tokens=100000", "context")),
    ("prompts_beyond_dataset", ("task.max_operand=2", "rollout.prompts_per_step=64"), ("rollout.prompts_per_step=64",)),
    (
        "prompts_beyond_file",
        dataset("<good.jsonl>", "rollout.prompts_per_step=50"),
        ("rollout.prompts_per_step=50", "6"),
    ),
    (
        "generations_beyond_memory",
        (
            "model.tiny.hidden_size=4096",
            "model.tiny.num_layers=8",
            "rollout.num_generations=4096",
            "rollout.max_new_tokens=64",
            "algorithm.micro_batch_size=65536",
        ),
        ("memory", "rollout.num_generations"),
    ),
    ("unknown_accelerator", ("trainer.accelerator=tpu9",), ("trainer.accelerator", "tpu9")),
    ("bad_precision", ("trainer.precision=17",), ("trainer.precision", "17")),
    ("zero_devices", ("trainer.devices=0",), ("trainer.devices",)),
    ("zero_eval_batch", ("eval.batch_size=0",), ("eval.batch_size",)),
    ("negative_top_k", ("rollout.top_k=-5",), ("rollout.top_k",)),
    ("unknown_lr_schedule", ("algorithm.lr_schedule=zigzag",), ("algorithm.lr_schedule", "zigzag")),
    ("zero_generation_batch", ("rollout.generation_batch_size=0",), ("rollout.generation_batch_size",)),
    ("negative_staleness", ("rollout.mode=async", "rollout.max_staleness=-1"), ("rollout.max_staleness",)),
    ("all_prompts_held_out", ("task.val_fraction=1.0",), ("task.val_fraction",)),
    ("negative_pass_k", ("eval.pass_k=-1",), ("eval.pass_k",)),
    ("negative_threads", ("trainer.num_threads=-1",), ("trainer.num_threads",)),
    ("unknown_rollout_mode", ("rollout.mode=sideways",), ("rollout.mode", "sideways")),
    ("unknown_decoder", ("rollout.hf_decoder=magic",), ("rollout.hf_decoder", "magic")),
    (
        "zero_sampling_rounds",
        ("rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=0"),
        ("rollout.max_sampling_rounds",),
    ),
    ("lora_bad_dropout", ("model.lora.rank=4", "model.lora.dropout=1.5"), ("model.lora.dropout",)),
    ("lora_missing_config", ("model.lora.config_file=/no/adapter_config.json",), ("model.lora.config_file",)),
    ("unknown_is_level", ("algorithm.is_level=galaxy",), ("algorithm.is_level", "galaxy")),
    ("output_dir_is_file", ("trainer.output_dir=<good.jsonl>",), ("trainer.output_dir",)),
    ("plugin_not_python", ("plugins=[<prompts.txt>]",), ("prompts.txt",)),
    ("tiny_alphabet_empty", ("model.tiny.alphabet=''",), ("model.tiny.alphabet",)),
    ("unknown_gradient_checkpointing", ("model.gradient_checkpointing=sometimes",), ("model.gradient_checkpointing",)),
    ("zero_max_completion_chars", ("task.max_completion_chars=-1",), ("task.max_completion_chars",)),
    ("gsm_unknown_split_key", ("task=gsm", "task.max_operand=3"), ("task.max_operand",)),
    ("rg_unknown_dataset", ("task=reasoning_gym", "task.dataset=no_such_puzzle"), ("no_such_puzzle",)),
    ("system_prompt_unencodable", ("task.system_prompt=Réponds",), ("é",)),
    ("eval_tokens_zero", ("eval.max_new_tokens=0",), ("eval.max_new_tokens",)),
    # model names
    ("missing_local_model", ("model.name_or_path=/no/such/model",), ("model.name_or_path", "/no/such/model")),
    ("missing_relative_model", ("model.name_or_path=./no_such_dir",), ("model.name_or_path", "no_such_dir")),
    ("hub_name_offline", ("model.name_or_path=someone/not-downloaded-model",), ("someone/not-downloaded-model",)),
    # data files
    ("data_missing", dataset("<good.jsonl>.nope"), ("task.path", "no such file")),
    ("data_empty", dataset("<empty.jsonl>"), ("empty.jsonl", "empty")),
    ("data_empty_csv", dataset("<empty.csv>"), ("empty.csv",)),
    ("data_blank_lines", dataset("<blank_lines.jsonl>"), ("blank_lines.jsonl",)),
    ("data_malformed_row", dataset("<malformed.jsonl>"), ("malformed.jsonl", "line 2 (row 1)", "JSON")),
    ("data_not_utf8", dataset("<not_utf8.jsonl>"), ("not_utf8.jsonl", "UTF-8", "line 2 (row 1)")),
    ("data_not_utf8_csv", dataset("<not_utf8.csv>"), ("not_utf8.csv", "UTF-8", "line 3 (row 1)")),
    ("data_csv_extra_field", dataset("<extra_field.csv>"), ("extra_field.csv", "line 3 (row 1)", "3 fields")),
    ("data_csv_missing_field", dataset("<missing_field.csv>"), ("missing_field.csv", "line 4 (row 1)", "1 field ")),
    ("data_csv_open_quote", dataset("<open_quote.csv>"), ("open_quote.csv", "line 3 (row 1)", "close the quote")),
    ("data_mixed_types", dataset("<mixed.jsonl>"), ("mixed.jsonl", "'answer'", "rows [1]", "rows [2]")),
    ("data_no_answer", dataset("<no_answer.jsonl>"), ("'arithmetic_exact'", "'answer'", "['prompt']")),
    ("data_no_prompt", dataset("<no_prompt.jsonl>"), ("no_prompt.jsonl", "prompt", "question")),
    ("data_blank_prompt", dataset("<blank_prompt.jsonl>"), ("blank_prompt.jsonl", "row 1")),
    ("data_number_prompt", dataset("<number_prompt.jsonl>"), ("number_prompt.jsonl", "row 0")),
    ("data_bad_chat_role", dataset("<bad_chat.jsonl>"), ("bad_chat.jsonl", "robot")),
    ("data_unencodable", dataset("<bad_chars.jsonl>"), ("bad_chars.jsonl", "row 0")),
    ("data_wrong_suffix", dataset("<prompts.txt>"), ("prompts.txt", ".txt")),
    ("data_plain_folder", dataset("<not_a_dataset>"), ("not_a_dataset",)),
    ("data_val_missing", dataset("<good.jsonl>", "task.val_path=/no/val.jsonl"), ("task.val_path",)),
    ("data_wrong_column", dataset("<good.jsonl>", "task.prompt_column=question"), ("task.prompt_column", "question")),
    # plug-ins
    ("plugin_missing", ("plugins=[/no/such/plugin.py]",), ("plugins", "/no/such/plugin.py")),
    ("plugin_syntax_error", ("plugins=[<syntax_error.py>]",), ("syntax_error.py", "SyntaxError")),
    ("plugin_raises", ("plugins=[<raises.py>]",), ("raises.py", "plug-in refuses to load")),
    ("plugin_bad_module", ("plugins=[no_such_module_xyz]",), ("no_such_module_xyz",)),
    ("plugin_duplicate_name", ("plugins=[<bad_register.py>]",), ("bad_register.py", "answer_format")),
    ("reward_modules_missing", ("task.reward_modules=[/no/rewards.py]",), ("/no/rewards.py",)),
    # resume paths
    ("resume_missing", ("trainer.resume=/no/such.ckpt",), ("trainer.resume", "/no/such.ckpt")),
    ("resume_folder", ("trainer.resume=<ckpt_dir.ckpt>",), ("trainer.resume", "ckpt_dir.ckpt")),
    ("resume_garbage", ("trainer.resume=<garbage.ckpt>",), ("trainer.resume", "garbage.ckpt", "not a checkpoint")),
    ("resume_text", ("trainer.resume=<text.ckpt>",), ("trainer.resume", "text.ckpt", "not a checkpoint")),
]


REACH_FIT: set[str] = set()  # cases refused only inside fit (none at present)


def run_cli(monkeypatch, tmp_path, capsys, args: tuple[str, ...], fit_allowed: bool = False) -> tuple[int, str, float]:
    """``grpo-lightning *args`` in this process: exit code, stderr and seconds taken."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *BASE, *args, f"hydra.run.dir={tmp_path}/run"])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_training(*a, **k):
        raise AssertionError("the bad input reached training")

    if not fit_allowed:
        monkeypatch.setattr(build, "fit", no_training)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as stop:
        train.cli()
    return stop.value.code, capsys.readouterr().err, time.perf_counter() - start


def assert_one_clear_line(code: int, err: str, seconds: float, said: tuple[str, ...], run_dir: Path) -> None:
    assert code == 2, err
    assert "Traceback" not in err and "Error executing job" not in err, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 3, err
    assert lines[0].startswith("error: "), err
    for word in said:
        assert word in err, f"{word!r} not in: {err}"
    assert seconds < FAIL_FAST_S, f"took {seconds:.1f} s: {err}"
    written = (
        [p for p in run_dir.rglob("*") if p.suffix in (".ckpt", ".tmp", ".safetensors")] if run_dir.exists() else []
    )
    assert not written, written
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize("case, args, said", CASES, ids=[c[0] for c in CASES])
def test_bad_input_ends_in_one_clear_line(case, args, said, files, monkeypatch, tmp_path, capsys):
    args = fill(args, files)
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, args, fit_allowed=case in REACH_FIT)
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")


def test_the_sweep_covers_sixty_inputs():
    assert len(CASES) >= 60


def test_a_hub_name_that_does_not_answer_fails_within_seconds(monkeypatch, tmp_path, capsys):
    """Downloads allowed but the Hub unreachable: one line naming the model, not minutes of retries."""
    asked = []

    def unreachable(self, repo_id, timeout=None, **kwargs):
        asked.append(timeout)
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(HfApi, "model_info", unreachable)
    monkeypatch.setattr(source, "offline", lambda: False)
    monkeypatch.setattr(source, "_ANSWERS", {})
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, ("model.name_or_path=someone/unreachable-model",))
    said = ("model.name_or_path='someone/unreachable-model'", "not a local folder", "downloading", "failed")
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")
    assert asked and 0 < asked[0] <= 5


def test_a_folder_without_config_is_not_a_model(tmp_path):
    (tmp_path / "weights.bin").write_text("x")
    with pytest.raises(ConfigError, match="no config.json"):
        source.model_source(str(tmp_path))


@pytest.mark.parametrize(
    "name, path",
    [("org/model", False), ("gpt2", False), ("./m", True), ("/abs/m", True), ("~/m", True), ("a/b/c", True)],
)
def test_path_looking_names(name, path):
    assert source.looks_like_path(name) is path


def test_http_request_logs_stay_out_of_the_run_log(monkeypatch, tmp_path, capsys):
    """httpx logs every request at INFO: a run's log must not fill with them unless asked for."""

    def requests_then_stop(*args, **kwargs):
        logging.getLogger("httpx").info("HTTP Request: POST http://127.0.0.1:8000/generate 200 OK")
        logging.getLogger("grpo_lightning").info("a line of our own")
        raise DataError("task.path='x.jsonl': stop here")

    for name in train.HTTP_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.setattr(build, "build_run", requests_then_stop)
    code, err, _ = run_cli(monkeypatch, tmp_path, capsys, ())
    assert code == 2 and "stop here" in err
    [log] = (tmp_path / "run").glob("*.log")
    assert "a line of our own" in log.read_text() and "HTTP Request" not in log.read_text()


def test_a_users_own_http_log_level_is_kept(monkeypatch):
    monkeypatch.setattr(logging.getLogger("httpx"), "level", logging.INFO)
    monkeypatch.setattr(logging.getLogger("httpcore"), "level", logging.NOTSET)
    train.quiet_http_logs()
    assert logging.getLogger("httpx").level == logging.INFO
    assert logging.getLogger("httpcore").level == logging.WARNING


def test_the_memory_estimate_refuses_what_cannot_fit_and_names_the_fields():
    cfg = TrainConfig()
    shape = memory.Shape(params=10**9, hidden=2048, layers=24, vocab=50_000, kv_width=2048, bytes_per_param=2)
    with pytest.raises(ConfigError) as refused:
        memory.check_memory(cfg, shape, available=(8 * memory.GIB, "of CPU memory available"))
    said = str(refused.value)
    assert "8.0 GiB of CPU memory available" in said and "rollout.num_generations=8" in said
    assert "algorithm.micro_batch_size=auto" in said and len(said.splitlines()) == 1
    memory.check_memory(cfg, shape, available=(1 << 50, "of CPU memory available"))  # fits: no error
    cfg.trainer.memory_check = False
    memory.check_memory(cfg, shape, available=(1, "of CPU memory available"))


def test_the_memory_estimate_grows_with_every_field_it_names():
    """Property: raising any of the fields the message tells the user to lower raises the estimate."""
    rng = random.Random(0)
    for _ in range(50):
        shape = memory.Shape(
            params=rng.randint(10**5, 10**10),
            hidden=rng.choice([64, 576, 4096]),
            layers=rng.randint(1, 64),
            vocab=rng.choice([19, 49_152, 150_000]),
            kv_width=rng.choice([64, 192, 1024]),
            bytes_per_param=rng.choice([2, 4]),
        )
        cfg = TrainConfig()
        cfg.rollout.prompts_per_step = rng.randint(1, 8)
        cfg.rollout.num_generations = rng.randint(2, 16)
        cfg.rollout.max_new_tokens = rng.randint(1, 512)
        cfg.algorithm.micro_batch_size = 1
        cfg.algorithm.logprob_chunk_mb = 0.0
        before = sum(memory.step_bytes(cfg, shape).values())
        field, group = rng.choice([("num_generations", cfg.rollout), ("max_new_tokens", cfg.rollout)])
        setattr(group, field, getattr(group, field) * 2)
        assert sum(memory.step_bytes(cfg, shape).values()) > before, field


def test_the_tiny_models_shape_is_read_without_memory():
    shape = memory.model_shape(TrainConfig().model)
    assert shape.layers == 2 and shape.hidden == 64 and shape.bytes_per_param == 4 and 10**4 < shape.params < 10**6


@pytest.mark.parametrize(
    "rows, mixed",
    [
        ([{"a": 1}, {"a": 2.5}, {"a": None}], False),  # numbers are one type; null fits any column
        ([{"a": "x"}, {"b": 3}], False),
        ([{"a": "x"}, {"a": True}], True),
        ([{"a": [1]}, {"a": {"k": 1}}], True),
    ],
)
def test_column_types(tmp_path, rows, mixed):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if mixed:
        with pytest.raises(DataError, match="column 'a' mixes types"):
            check_text_file(path, "task.path", str(path))
    else:
        check_text_file(path, "task.path", str(path))


def test_required_columns_of_a_reward():
    def needs(prompts, completions, answer, level, hint=None, completion_ids=None, **kwargs):
        return []

    def takes_all(prompts, completions, **kwargs):
        return []

    assert required_columns(needs) == ["answer", "level"]
    assert required_columns(takes_all) == []


def test_true_subprocess_runs_end_in_one_line(files, tmp_path):
    """The console entry as a user runs it: two bad inputs in parallel processes."""
    runs = {
        "unknown_key": (["rollout.num_generation=4"], "did you mean rollout.num_generations?"),
        "bad_data": (list(dataset(files["malformed.jsonl"])), "line 2 (row 1)"),
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("HYDRA_FULL_ERROR", None)
    procs = {}
    start = time.perf_counter()
    for name, (args, _) in runs.items():
        command = [sys.executable, "-m", "grpo_lightning.train", *BASE, *args, f"hydra.run.dir={tmp_path / name}"]
        procs[name] = subprocess.Popen(
            command, cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err[-2000:]
        assert err.startswith("error: ") and len(err.strip().splitlines()) <= 3, err[-2000:]
        assert runs[name][1] in err and "Traceback" not in err, err[-2000:]
        assert not (tmp_path / name / "checkpoints").exists()
    assert time.perf_counter() - start < 60


@pytest.mark.parametrize("args", [("algorithm.beta=-1",), dataset("<mixed.jsonl>"), ("model.name_or_path=/no/model",)])
def test_a_bad_input_leaves_an_earlier_runs_folder_as_it_was(args, files, monkeypatch, tmp_path, capsys):
    """Rerun in a folder holding a checkpoint with a bad input: nothing there changes."""
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "step=4.ckpt").write_bytes(b"earlier run")
    before = {p: p.read_bytes() for p in checkpoints.rglob("*")}
    args = fill(args, files)
    code, err, _ = run_cli(monkeypatch, tmp_path, capsys, args)
    assert code == 2 and "Traceback" not in err, err
    assert {p: p.read_bytes() for p in checkpoints.rglob("*")} == before


# ============================================================================= reward sources
# (issue 46) A reward source's bad options, URL, key, folder or interpreter: refused by the config's checks or
# when the run builds the sources it names, before training; never at the first batch.
JUDGED = "task.rewards={judge: 1.0}"
REWARD_SOURCE_CASES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("judge_url_not_http", (JUDGED, "rewards.judge.url=ftp://judge/v1"), ("rewards.judge.url", "http(s)")),
    ("judge_url_without_host", (JUDGED, "rewards.judge.url=http:///v1"), ("rewards.judge.url",)),
    ("judge_url_empty", (JUDGED,), ("rewards.judge.url is empty",)),
    (
        "judge_key_unset",
        (JUDGED, "rewards.judge.url=http://127.0.0.1:9/v1", "rewards.judge.api_key_env=NO_SUCH_JUDGE_KEY_46"),
        ("rewards.judge.api_key_env='NO_SUCH_JUDGE_KEY_46'", "unset"),
    ),
    ("judge_unknown_verdict", (JUDGED, "rewards.judge.verdict=stars"), ("rewards.judge.verdict", "stars")),
    ("judge_negative_timeout", ("rewards.judge.timeout_s=-1",), ("rewards.judge.timeout_s",)),
    ("judge_zero_reply_cap", ("rewards.judge.max_reply_kb=0",), ("rewards.judge.max_reply_kb",)),
    ("judge_misspelt_key", ("rewards.judge.urll=http://h/v1",), ("rewards.judge.urll", "rewards.judge.url")),
    (
        "reward_model_folder_missing",
        ("task.rewards={reward_model: 1.0}", "rewards.reward_model.path=/no/such/rm"),
        ("rewards.reward_model.path", "/no/such/rm", "no config.json"),
    ),
    (
        "reward_model_without_head",
        ("task.rewards={reward_model: 1.0}", "rewards.reward_model.path=<causal_lm>"),
        ("rewards.reward_model.path", "causal_lm", "score.weight"),
    ),
    ("reward_model_bad_dtype", ("rewards.reward_model.dtype=float8",), ("rewards.reward_model.dtype", "float8")),
    ("sandbox_zero_cpu", ("task=code", "rewards.code_tests.cpu_s=0"), ("rewards.code_tests.cpu_s",)),
    ("sandbox_zero_scratch", ("task=code", "rewards.code_tests.scratch_mb=0"), ("rewards.code_tests.scratch_mb",)),
    ("sandbox_negative_wall", ("task=code", "rewards.code_tests.wall_s=-1"), ("rewards.code_tests.wall_s",)),
    ("sandbox_no_python", ("task=code", "rewards.code_tests.python=/no/python3"), ("rewards.code_tests.python",)),
    (
        "sandbox_python_that_does_not_run",
        ("task.rewards={code_tests: 1.0}", "rewards.code_tests.python=<not_python>"),  # tiny model: not task=code
        ("rewards.code_tests.python", "does not run"),
    ),
    ("sandbox_visible_missing", ("task=code", "rewards.code_tests.visible=[/no/such/dir]"), ("/no/such/dir",)),
    ("reward_timeout_negative", ("task.reward_timeout_s=-5",), ("task.reward_timeout_s",)),
    (
        "reward_process_without_limit",
        ("task.reward_timeout_s=null", "task.reward_process=true"),
        ("task.reward_process=true needs task.reward_timeout_s",),
    ),
]


@pytest.fixture(scope="module")
def source_files(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("reward_sources")
    not_python = root / "not_python"
    not_python.write_text("#!/bin/sh\nexit 3\n")
    not_python.chmod(0o755)
    return {"causal_lm": str(save_tiny_causal_lm(root / "causal_lm")), "not_python": str(not_python)}


@pytest.mark.parametrize("case, args, said", REWARD_SOURCE_CASES, ids=[c[0] for c in REWARD_SOURCE_CASES])
def test_a_bad_reward_source_ends_in_one_clear_line(case, args, said, source_files, monkeypatch, tmp_path, capsys):
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, fill(args, source_files))
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")


# ============================================================================= environments and tools
# (issue 46) What a user's environment or tool gets wrong: each one line naming the environment, exit 2
# where the run cannot go on, no traceback, within seconds. Most are found before the first step, when
# one environment is made and reset on the first row (environments/calls.py: first_reset).
ENVIRONMENTS_PLUGIN = '''
import threading

from grpo_lightning.environments.base import ENVIRONMENTS, Reset, Step
from grpo_lightning.environments.tools import ToolEnvironment


class Env:
    """Resets to a guess-the-number prompt; each variant below breaks one thing."""

    def reset(self, seed, row):
        return Reset(messages=[{"role": "user", "content": "1-8?"}])

    def step(self, turn):
        return Step(messages=[{"role": "user", "content": "="}], reward=1.0, done=True)

    def close(self):
        pass


class RaisesAtReset(Env):
    def reset(self, seed, row):
        raise KeyError("scoreboard")


class HangsAtReset(Env):
    def reset(self, seed, row):
        threading.Event().wait()


class MessagesNotAList(Env):
    def reset(self, seed, row):
        return Reset(messages="not a list")


class BogusRole(Env):
    def reset(self, seed, row):
        return Reset(messages=[{"role": "bogus", "content": "1-8?"}])


class IntegerContent(Env):
    def reset(self, seed, row):
        return Reset(messages=[{"role": "user", "content": 7}])


class StringReward(Env):
    def step(self, turn):
        return Step(messages=[{"role": "user", "content": "="}], reward="1.0", done=True)


class RaisesInStep(Env):
    def step(self, turn):
        raise RuntimeError("the scoreboard is down")


def no_docstring(x: int) -> int:
    return x


def factory_raises(options, row):
    raise ConnectionError("no environment server at 127.0.0.1:1")


for name, cls in [
    ("raises_at_reset", RaisesAtReset),
    ("hangs_at_reset", HangsAtReset),
    ("messages_not_a_list", MessagesNotAList),
    ("bogus_role", BogusRole),
    ("integer_content", IntegerContent),
    ("string_reward", StringReward),
    ("raises_in_step", RaisesInStep),
]:
    ENVIRONMENTS.register(name)(lambda options, row, cls=cls: cls())
ENVIRONMENTS.register("tool_without_docstring")(lambda options, row: ToolEnvironment([no_docstring]))
ENVIRONMENTS.register("factory_raises")(factory_raises)
'''


@pytest.fixture(scope="module")
def environments_plugin(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("environments") / "bad_environments.py"
    path.write_text(ENVIRONMENTS_PLUGIN)
    return str(path)


def episodes(plugin: str, environment: str, *more: str) -> tuple[str, ...]:
    return (
        f"plugins=[{plugin}]",
        "task=guess_number",
        f"task.environment={environment}",
        "rollout.prompts_per_step=2",
        "rollout.num_generations=2",
        "rollout.max_new_tokens=3",
        *more,
    )


ENVIRONMENT_CASES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("unknown", (), ("task.environment", "no_such_environment")),
    ("raises_at_reset", (), ("environment 'raises_at_reset': reset() raised KeyError: 'scoreboard'", "at start-up")),
    (
        "hangs_at_reset",
        ("task.step_timeout_s=0.5",),
        ("'hangs_at_reset': reset() took over task.step_timeout_s=0.5 s",),
    ),
    ("messages_not_a_list", (), ("'messages_not_a_list': reset().messages must be a list", "got a str")),
    ("bogus_role", (), ("'bogus_role': reset().messages[0] has role 'bogus'",)),
    ("integer_content", (), ("'integer_content': reset().messages[0] content must be a string, got a int",)),
    ("tool_without_docstring", (), ("tool 'no_docstring'", "docstring")),
    ("factory_raises", (), ("environment 'factory_raises': could not be made: ConnectionError",)),
]


@pytest.mark.parametrize("environment, more, said", ENVIRONMENT_CASES, ids=[c[0] for c in ENVIRONMENT_CASES])
def test_a_broken_environment_ends_in_one_clear_line(
    environment, more, said, environments_plugin, monkeypatch, tmp_path, capsys
):
    name = "no_such_environment" if environment == "unknown" else environment
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, episodes(environments_plugin, name, *more))
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")


@pytest.mark.slow  # a one-step run
def test_an_environment_returning_a_string_reward_ends_the_run_in_one_line(
    environments_plugin, monkeypatch, tmp_path, capsys
):
    args = episodes(environments_plugin, "string_reward", "trainer.max_steps=1", "eval.before_training=false")
    code, err, seconds = run_cli(monkeypatch, tmp_path, capsys, args, fit_allowed=True)
    said = ("environment 'string_reward': step().reward must be a number or None", "got a str: '1.0'")
    assert_one_clear_line(code, err, seconds, said, tmp_path / "run")


@pytest.mark.slow  # a one-step run
def test_an_environment_raising_in_its_steps_is_named_in_one_line_and_the_run_goes_on(
    environments_plugin, monkeypatch, tmp_path, capsys
):
    """Failed episodes are masked out and counted, by design; what the user needs is the exception, at once."""
    monkeypatch.chdir(tmp_path)
    args = episodes(environments_plugin, "raises_in_step", "trainer.max_steps=1", "logger=none")
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args, f"hydra.run.dir={tmp_path}/run"])
    start = time.perf_counter()
    try:
        train.cli()
    except SystemExit as stop:
        assert stop.code in (0, None)
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if "env_error in" in line]
    assert len(lines) == 1 and "Traceback" not in out.out + out.err, out
    assert "environment 'raises_in_step': step() raised RuntimeError: the scoreboard is down (" in lines[0]
    assert "bad_environments.py:" in lines[0] and time.perf_counter() - start < 60
