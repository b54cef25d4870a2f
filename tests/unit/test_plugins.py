"""One plug-in mechanism: from single files outside the package, passed with ``plugins=[...]``
to the CLI's composition and run, a policy loss with its own option (the logged loss follows
the option) and a health check with its own option (its alert fires as the option says);
unknown names at every extension point fail at config time naming the closest match."""

from __future__ import annotations

import warnings

import pytest

from grpo_lightning.algorithm import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES
from grpo_lightning.config import HEALTH_CHECKS, ConfigError, TrainConfig, validate_config
from grpo_lightning.config.compose import compose
from grpo_lightning.registry import _LOADED, Registry, load_plugins, plugin_module
from grpo_lightning.rewards import REWARD_FUNCTIONS, register_reward
from grpo_lightning.train import run

LOSS_PLUGIN = '''
from dataclasses import dataclass, field

from grpo_lightning.algorithm import POLICY_LOSSES, register_policy_loss
from grpo_lightning.algorithm.policy_loss import grpo_loss
from grpo_lightning.rewards import register_reward


@register_reward("plugin_length")
def plugin_length(prompts, completions, **_):
    """Varies within a group from the first step (the tiny model solves no sum yet)."""
    return [float(len(c)) for c in completions]


@dataclass
class ScaledOptions:
    """How much to scale GRPO's loss by."""

    scale: float = field(default=1.0, metadata={"help": "Factor on the GRPO loss."})


@register_policy_loss("plugin_scaled", ratio_one_identity=False, options=ScaledOptions)
def scaled(inputs, cfg):
    out = grpo_loss(inputs, cfg)
    return out._replace(loss=cfg.plugin_scaled.scale * out.loss)
'''

CHECK_PLUGIN = '''
from dataclasses import dataclass

from grpo_lightning.config import CheckConfig
from grpo_lightning.config.base import option
from grpo_lightning.health.alerts import Finding
from grpo_lightning.health.base import HealthCheck, register_check


@dataclass
class BatchSizeOptions(CheckConfig):
    """Alert on generation batches larger than a bound."""

    patience: int = option(1, "Steps in a row before the alert.")
    max_sequences: int = option(1000, "Alert when a step trains on more sequences than this.")


@register_check(BatchSizeOptions)
class BatchSizeCheck(HealthCheck):
    name = "plugin_batch_size"
    failure = "P1"
    title = "a large generation batch"

    def measure(self, view):
        return {"sequences": float(view.rollout.rewards.numel())}

    def evaluate(self, totals, view):
        metrics = {"sequences": totals["sequences"]}
        if totals["sequences"] <= self.cfg.max_sequences:
            return metrics, None
        return metrics, Finding(f"{totals['sequences']:.0f} sequences > {self.cfg.max_sequences}", metrics)

    def diagnosis(self, view):
        return "a test plug-in", "raise health.plugin_batch_size.max_sequences"
'''

SHORT = [
    "trainer.max_steps=1",
    "rollout.prompts_per_step=2",
    "rollout.num_generations=4",
    "algorithm.beta=0",  # the logged loss is the policy term alone
    "eval.before_training=false",
    "logger=none",
]


@pytest.fixture(scope="module")
def plugin_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("user_plugins")
    (folder / "my_loss.py").write_text(LOSS_PLUGIN)
    (folder / "my_check.py").write_text(CHECK_PLUGIN)
    yield f"plugins=[{folder / 'my_loss.py'},{folder / 'my_check.py'}]"
    # Unregister, so the rest of the suite runs with the package's own entries only.
    for registry, name in (
        (POLICY_LOSSES, "plugin_scaled"),
        (HEALTH_CHECKS, "plugin_batch_size"),
        (REWARD_FUNCTIONS, "plugin_length"),
    ):
        registry.entries.pop(name, None)
    for path in ("my_loss.py", "my_check.py"):
        _LOADED.pop(str(folder / path), None)


def _train(plugins: str, *overrides: str, out) -> dict[str, float]:
    """The CLI's path in-process: both composition phases (plug-ins imported first), then run."""
    cfg, raw = compose([plugins, *SHORT, f"trainer.output_dir={out}", *overrides])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = run(cfg, logged_config=None)
    metrics["warned"] = float(any("plugin_batch_size" in str(w.message) for w in caught))
    return metrics


@pytest.fixture(scope="module")
def two_runs(plugin_files, tmp_path_factory):
    """Scale 1 with an alert bound the batch exceeds; scale 2 with one it does not."""
    common = ["algorithm.policy_loss=plugin_scaled", "task.rewards={plugin_length: 1.0}"]
    one = _train(
        plugin_files,
        *common,
        "algorithm.plugin_scaled.scale=1.0",
        "health.plugin_batch_size.max_sequences=4",
        out=tmp_path_factory.mktemp("run1"),
    )
    two = _train(
        plugin_files,
        *common,
        "algorithm.plugin_scaled.scale=2.0",
        "health.plugin_batch_size.max_sequences=100",
        out=tmp_path_factory.mktemp("run2"),
    )
    return one, two


def test_a_plugin_loss_option_sets_the_logged_loss(two_runs):
    one, two = two_runs
    assert one["train/loss"] != 0.0
    assert two["train/loss"] == pytest.approx(2.0 * one["train/loss"], rel=1e-5)


def test_a_plugin_health_check_alerts_as_its_option_says(two_runs):
    one, two = two_runs
    assert one["health/plugin_batch_size/sequences"] == 8.0
    assert one["health/alert/plugin_batch_size"] == 1.0 and one["warned"] == 1.0
    assert two["health/alert/plugin_batch_size"] == 0.0 and two["warned"] == 0.0


def test_a_plugins_options_are_validated_and_typos_name_the_closest(plugin_files, tmp_path):
    """The plug-in's nodes exist after phase 1; a typo in one is refused, with or without +."""
    out = f"trainer.output_dir={tmp_path}"
    with pytest.raises(ConfigError, match="did you mean health.plugin_batch_size.max_sequences"):
        compose([plugin_files, out, "+health.plugin_batch_size.max_seqs=3"])
    with pytest.raises(ConfigError, match="did you mean algorithm.plugin_scaled.scale"):
        compose([plugin_files, out, "+algorithm.plugin_scaled.scael=3"])
    with pytest.raises(ConfigError, match="max_seqs"):  # without +, Hydra refuses it (as for every group)
        compose([plugin_files, out, "health.plugin_batch_size.max_seqs=3"])
    assert (
        compose([plugin_files, out, "health.plugin_batch_size.max_sequences=3"])[
            0
        ].health.plugin_batch_size.max_sequences
        == 3
    )
    cfg, _ = compose([plugin_files, f"trainer.output_dir={tmp_path}", "health.plugin_batch_size.patience=0"])
    with pytest.raises(ConfigError, match="health.plugin_batch_size.patience=0 must be >= 1"):
        validate_config(cfg)


def test_the_registered_nodes_exist_in_python_too(plugin_files):
    cfg = TrainConfig()
    assert cfg.algorithm.sapo.tau_neg == 1.05 and cfg.health.diversity.action == "warn"
    cfg.health.truncation.max_clipped_frac = 2.0
    with pytest.raises(ConfigError, match="health.truncation.max_clipped_frac=2.0 must be in"):
        validate_config(cfg)


@pytest.mark.parametrize(
    ("key", "bad", "closest"),
    [
        ("algorithm.policy_loss", "gspoo", "gspo"),
        ("algorithm.advantage_estimator", "rlooo", "rloo"),
        ("algorithm.kl_estimator", "k33", "k3"),
        ("algorithm.loss_agg", "token_means", "token_mean"),
    ],
)
def test_unknown_variant_names_fail_at_config_time_naming_the_closest(key, bad, closest, tmp_path):
    cfg, _ = compose([f"trainer.output_dir={tmp_path}", f"{key}={bad}"])
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert f"{key}={bad!r} is not a registered" in str(err.value)
    assert f"did you mean {closest!r}?" in str(err.value)


def test_unknown_health_option_keys_fail_naming_the_closest(tmp_path):
    with pytest.raises(ConfigError, match="did you mean health.diversity.patience"):
        compose([f"trainer.output_dir={tmp_path}", "+health.diversity.patiense=3"])
    with pytest.raises(ConfigError, match="patiense"):
        compose([f"trainer.output_dir={tmp_path}", "health.diversity.patiense=3"])
    with pytest.raises(ConfigError, match="did you mean health.truncation"):
        compose([f"trainer.output_dir={tmp_path}", "+health.truncaton.window=3"])


def test_unknown_reward_names_fail_naming_the_closest():
    cfg = TrainConfig()
    cfg.task.rewards = {"arithmetic_exacct": 1.0}
    with pytest.raises(ConfigError, match="task.rewards.arithmetic_exacct='arithmetic_exacct' is not a registered"):
        validate_config(cfg)
    assert "did you mean 'arithmetic_exact'?" in REWARD_FUNCTIONS.problem("arithmetic_exacct")


def test_a_plain_function_registers_under_its_own_name():
    def plugin_plain_reward(prompts, completions, **_):
        return [0.0] * len(completions)

    try:
        assert register_reward(plugin_plain_reward) is plugin_plain_reward
        assert REWARD_FUNCTIONS["plugin_plain_reward"] is plugin_plain_reward
    finally:
        REWARD_FUNCTIONS.entries.pop("plugin_plain_reward", None)


def test_every_extension_point_is_one_registry():
    for registry in (
        POLICY_LOSSES,
        ADVANTAGE_ESTIMATORS,
        KL_ESTIMATORS,
        LOSS_AGG_MODES,
        REWARD_FUNCTIONS,
        HEALTH_CHECKS,
    ):
        assert isinstance(registry, Registry)


def test_one_plugin_file_named_two_ways_is_imported_once(tmp_path, monkeypatch):
    """Regression: a notebook (or a test) that named a plug-in file by its absolute path and then
    by a relative one imported it twice, and its second register_* call failed as a duplicate."""
    (tmp_path / "twice_reward.py").write_text(
        "from grpo_lightning.rewards import register_reward\n"
        "@register_reward('named_twice')\n"
        "def named_twice(prompts, completions, **kwargs):\n"
        "    return [0.0 for _ in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    first = plugin_module(str(tmp_path / "twice_reward.py"))
    load_plugins(["twice_reward.py", "./twice_reward.py"])  # raised "already registered" before the fix
    assert plugin_module("twice_reward.py") is first
    assert "named_twice" in REWARD_FUNCTIONS
