"""Two-phase composition: unknown keys refused (with and without +, and in Python) naming the
closest field, dict fields assigned, plugins imported first, micro_batch_size=auto, one source
of truth for defaults, and a schema layer that imports nothing above it."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grpo_lightning.config import (
    AlgorithmConfig,
    ConfigError,
    Schema,
    TaskConfig,
    TrainConfig,
    UnknownFieldError,
    validate_config,
)
from grpo_lightning.config.algorithm import AUTO_LOGPROB_CHUNK_MB, divisors, logprob_chunk_mb
from grpo_lightning.config.compose import CONF_DIR, compose, schema
from grpo_lightning.config.nodes import with_plugin_nodes
from grpo_lightning.errors import ConfigError as BaseConfigError

OUT = "trainer.output_dir=/tmp/unused"


def test_config_error_is_the_one_from_errors():
    assert ConfigError is BaseConfigError


@pytest.mark.parametrize(
    "override, unknown, closest",
    [
        ("+algorithm.learning_rate=1e-6", "algorithm.learning_rate", "algorithm.lr"),
        ("+num_generations=2", "num_generations", "rollout.num_generations"),
        ("+trainer.max_step=3", "trainer.max_step", "trainer.max_steps"),
        ("+rollout.vllm.server.prot=1", "rollout.vllm.server.prot", "rollout.vllm.server.port"),
    ],
)
def test_unknown_keys_are_refused_even_with_plus_naming_the_closest(override, unknown, closest):
    with pytest.raises(ConfigError) as err:
        compose([OUT, override])
    assert f"{unknown} is not a config field; did you mean {closest}?" in str(err.value)


def test_unknown_keys_without_plus_are_refused_too():
    with pytest.raises(ConfigError, match="algorithm.learning_rate"):
        compose([OUT, "algorithm.learning_rate=1e-6"])


def test_unknown_attributes_are_refused_in_python_naming_the_closest():
    cfg = TrainConfig()
    with pytest.raises(AttributeError, match="did you mean 'lr'"):
        cfg.algorithm.learning_rate = 1e-6
    with pytest.raises(ConfigError, match="did you mean 'num_generations'"):
        cfg.rollout.num_generation = 2
    assert isinstance(UnknownFieldError("x"), AttributeError)
    cfg.algorithm.lr = 1e-6  # a real field is still set
    assert cfg.algorithm.lr == 1e-6 and not hasattr(cfg.algorithm, "learning_rate")


def test_the_guard_stays_compatible_with_omegaconf_structured_configs():
    cfg = TrainConfig()
    cfg.algorithm.lr = 2e-5
    node = OmegaConf.structured(cfg)
    back = OmegaConf.to_object(node)
    assert back == cfg and isinstance(back.algorithm, Schema)
    with pytest.raises(Exception, match="learning_rate"):
        node.algorithm.learning_rate = 1.0  # struct mode refuses it too
    typed, _ = compose([OUT, "algorithm.lr=1e-5"])
    with pytest.raises(AttributeError):
        typed.trainer.max_step = 1


def test_a_dict_field_is_assigned_without_plus_and_plus_still_adds():
    cfg, raw = compose([OUT, "task.rewards={arithmetic_exact: 1.0}"])
    assert cfg.task.rewards == {"arithmetic_exact": 1.0}
    assert OmegaConf.to_container(raw.task.rewards) == {"arithmetic_exact": 1.0}  # what the logger records
    cfg, _ = compose([OUT, "task.rewards={arithmetic_exact: 1.0}", "+task.rewards.answer_format=0.5"])
    assert cfg.task.rewards == {"arithmetic_exact": 1.0, "answer_format": 0.5}
    cfg, _ = compose([OUT, "+task.rewards.answer_format=0.2", "~task.rewards.arithmetic_close"])
    assert cfg.task.rewards == {"arithmetic_exact": 0.5, "answer_format": 0.2}
    cfg, _ = compose([OUT, "task=gsm", "task.rewards={gsm_exact: 2.0}"])
    assert cfg.task.rewards == {"gsm_exact": 2.0}
    validate_config(cfg)


def test_a_string_where_a_number_belongs_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        compose([OUT, "trainer.max_steps='1e3'"])
    cfg = TrainConfig()
    cfg.trainer.max_steps = "1e3"
    cfg.algorithm.lr = "fast"
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert "trainer.max_steps='1e3' must be an int" in str(err.value)
    assert "algorithm.lr='fast' must be a float" in str(err.value)


REWARD_PLUGIN = (
    "from grpo_lightning.rewards import register_reward\n\n"
    "@register_reward({name!r})\ndef f(prompts, completions, **_):\n    return [1.0] * len(completions)\n"
)


def test_plugins_import_a_file_whose_reward_can_then_be_named(tmp_path):
    plugin = tmp_path / "plugin_reward_cmp.py"
    plugin.write_text(REWARD_PLUGIN.format(name="from_plugin_cmp"))
    cfg, _ = compose([OUT, f"plugins=[{plugin}]", "task.rewards={from_plugin_cmp: 1.0}"])
    assert cfg.plugins == [str(plugin)]
    validate_config(cfg)
    with pytest.raises(ConfigError, match="plugins: 'no_such_plugin_mod' is neither a file"):
        compose([OUT, "plugins=[no_such_plugin_mod]"])


def test_reward_modules_work_without_a_deprecation_line(tmp_path):
    """task.reward_modules is TRL users' way in (issue 28): imported like plugins, and no longer deprecated."""
    plugin = tmp_path / "old_style_rewards_cmp.py"
    plugin.write_text(REWARD_PLUGIN.format(name="from_reward_modules_cmp"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        cfg, _ = compose([OUT, f"task.reward_modules=[{plugin}]", "task.rewards={from_reward_modules_cmp: 1.0}"])
    assert str(plugin) in cfg.plugins  # merged into plugins
    validate_config(cfg)


def test_micro_batch_size_auto_fits_small_batches():
    cfg, _ = compose([OUT, "rollout.prompts_per_step=2", "rollout.num_generations=4"])
    assert cfg.algorithm.micro_batch_size == "auto"
    validate_config(cfg)
    assert cfg.algorithm.micro_batch(8) == 8
    assert AlgorithmConfig().micro_batch(16 * 8) == 32  # the old default where it fitted
    rng = random.Random(0)
    for _ in range(300):
        batch = rng.randint(1, 500)
        size = AlgorithmConfig().micro_batch(batch)
        assert batch % size == 0 and size <= 32
        assert not any(batch % d == 0 for d in range(size + 1, 33))  # the largest such divisor


def test_micro_batch_size_auto_takes_more_short_sequences_up_to_the_token_cap():
    """Short sequences: one pass over many beats many passes of per-op overhead (the demo's 128 x 12 tokens)."""
    assert AlgorithmConfig().micro_batch(16 * 8, width=12) == 128
    assert AlgorithmConfig().micro_batch(16 * 8, width=128) == 32  # what 32 sequences of 128 tokens hold
    assert AlgorithmConfig(micro_batch_size=4).micro_batch(16 * 8, width=12) == 4  # explicit wins
    rng = random.Random(1)
    for _ in range(500):
        batch, width = rng.randint(1, 600), rng.randint(1, 400)
        size = AlgorithmConfig().micro_batch(batch, width)
        allowed = [d for d in range(1, batch + 1) if batch % d == 0 and (d <= 32 or d * width <= 4096)]
        assert size == max(allowed)
        assert size >= AlgorithmConfig().micro_batch(batch)  # never fewer than without the width


def test_an_explicit_micro_batch_size_that_does_not_divide_fails_naming_the_divisors():
    cfg, _ = compose([OUT, "rollout.prompts_per_step=2", "rollout.num_generations=4", "algorithm.micro_batch_size=3"])
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert "algorithm.micro_batch_size=3 must divide" in str(err.value) and str(divisors(8)[-4:])[1:-1] in str(
        err.value
    )
    cfg.algorithm.micro_batch_size = "big"
    with pytest.raises(ConfigError, match="micro_batch_size='big' must be auto or an int"):
        validate_config(cfg)


def _yaml_leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict) and value and key not in ("rewards", "dataset_options", "sources"):
            yield from _yaml_leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("path", sorted(CONF_DIR.glob("*/*.yaml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_yaml_key_is_a_schema_field_of_the_same_type(path):
    """The YAML files set only real fields with values of the field's type (the schema's defaults
    and the files cannot disagree about what a field is)."""
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    raw.pop("defaults", None)
    glob = path.read_text().startswith("# @package _global_")
    task = path.stem if path.parent.name == "task" else "arithmetic"  # a task file's schema is its task's
    base = OmegaConf.structured(schema(task)) if glob else OmegaConf.structured(schema(task))[path.parent.name]
    for key, value in _yaml_leaves(raw):
        assert OmegaConf.select(base, key, default="<missing>") != "<missing>", f"{path.name}: {key}"
        OmegaConf.update(base, key, value, merge=True)  # raises on a value of the wrong type


@pytest.mark.slow
def test_composed_groups_equal_the_dataclass_defaults_outside_what_their_yaml_sets():
    for path in sorted(CONF_DIR.glob("*/*.yaml")):
        if path.read_text().startswith("# @package _global_"):
            continue
        group = path.parent.name
        task = TaskConfig(name=path.stem).promoted() if group == "task" else TaskConfig()  # its own defaults
        # The schema as composition builds it: a node per registered entry's options (algorithm.sapo, health.*).
        defaults = OmegaConf.to_container(OmegaConf.structured(with_plugin_nodes(TrainConfig)(task=task)))
        _, raw = compose([OUT, f"{group}={path.stem}"])
        composed = OmegaConf.to_container(raw[group])
        own = OmegaConf.to_container(OmegaConf.load(path))
        parents = [d for d in own.pop("defaults", []) if isinstance(d, str) and d != "_self_"]
        for parent in parents:
            own = {**OmegaConf.to_container(OmegaConf.load(path.parent / f"{parent}.yaml")), **own}
        own.pop("defaults", None)
        brought = task.model_defaults.get("tiny", {})  # what the task brings for the default model, in its class
        for key, value in composed.items():
            if (
                key in own
                or f"{group}.{key}" in brought
                or (group, key) in (("task", "rewards"), ("trainer", "output_dir"))
            ):
                continue
            assert value == defaults[group][key], f"{group}={path.stem}: {group}.{key}"


@pytest.mark.slow
def test_the_schema_imports_nothing_above_it():
    """config/ is the lowest layer: importing it loads no rewards, data, models or rollout code.
    The package's own __init__ is skipped (it imports everything by design)."""
    root = Path(__file__).resolve().parents[3]
    code = (
        "import sys, types; pkg = types.ModuleType('grpo_lightning'); "
        f"pkg.__path__ = [{str(root / 'grpo_lightning')!r}]; sys.modules['grpo_lightning'] = pkg; "
        "import grpo_lightning.config, grpo_lightning.config.compose; "
        "bad = sorted(m for m in sys.modules if m.split('.')[:2] in "
        "[['grpo_lightning', n] for n in ('rewards', 'data', 'models', 'rollout', 'module', 'build', 'callbacks', "
        "'health')]); print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_help_text_is_one_short_line():
    def walk(cls):
        for f in dataclasses.fields(cls):
            text = f.metadata.get("help", "")
            assert text and len(text) <= 150 and "\n" not in text, f"{cls.__name__}.{f.name}: {len(text)}"
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                walk(type(default))

    walk(TrainConfig)


def test_logprob_chunk_mb_auto_keeps_a_cpus_budget_and_gives_a_gpu_larger_chunks():
    auto = AlgorithmConfig()
    assert auto.logprob_chunk_mb == "auto"
    assert auto.chunk_mb("cpu") == AUTO_LOGPROB_CHUNK_MB["cpu"] == 96.0  # what the CPU memory table measured
    assert auto.chunk_mb("cuda") == AUTO_LOGPROB_CHUNK_MB["gpu"] > auto.chunk_mb("cpu")
    assert AlgorithmConfig(logprob_chunk_mb=32).chunk_mb("cuda") == 32.0  # a number is taken as is
    assert logprob_chunk_mb("auto", "cpu", frozen_head=True) == AUTO_LOGPROB_CHUNK_MB["cpu, frozen head"] == 32.0
    assert logprob_chunk_mb("auto", "cuda", frozen_head=True) == AUTO_LOGPROB_CHUNK_MB["gpu"]
    assert logprob_chunk_mb(64, "cpu", frozen_head=True) == 64.0


@pytest.mark.parametrize("bad", ["big", 0, -1.5, True])
def test_a_bad_logprob_chunk_mb_is_refused_naming_the_field(bad):
    cfg, _ = compose([OUT])
    cfg.algorithm.logprob_chunk_mb = bad
    with pytest.raises(ConfigError, match=r"logprob_chunk_mb=.* must be auto or a number > 0"):
        validate_config(cfg)


@pytest.mark.parametrize(
    ("args", "run_dir"),
    [
        (["trainer.output_dir=/runs/a"], "/runs/a"),
        (["output_dir=runs/b"], "runs/b"),  # TRL's name for it
        (["trainer.output_dir=/runs/a", "hydra.run.dir=/elsewhere"], "/elsewhere"),  # the user's choice stays
        ([], None),  # Hydra's timestamped folder, and trainer.output_dir follows it
    ],
)
def test_the_cli_puts_hydra_files_in_the_output_dir_the_command_line_names(monkeypatch, args, run_dir):
    """Two runs started in the same second with their own trainer.output_dir shared Hydra's
    timestamped folder (its lock refused the second) and split .hydra/ and train.log from the run."""
    import grpo_lightning.train as train  # noqa: PLC0415

    seen = []
    monkeypatch.setattr(train, "main", lambda: seen.append(list(sys.argv[1:])))
    monkeypatch.setattr(sys, "argv", ["grpo-lightning", *args])
    train._plan_then_main()
    given = [a.split("=", 1)[1] for a in seen[0] if a.startswith("hydra.run.dir=")]
    assert given == ([run_dir] if run_dir else [])
