"""The built-in registered names the CLI's early check reads (config/registered_names.json) are
the registries' own, and its messages are the full path's."""

from __future__ import annotations

import importlib

import pytest

from grpo_lightning.config.base import choice
from grpo_lightning.config.early_names import INDEX_FILE, name_problem, reward_problem
from grpo_lightning.registered_index import SOURCES, render
from grpo_lightning.registry import Registry, load_plugins
from grpo_lightning.rewards.lookup import reward_problem as full_reward_problem
from grpo_lightning.rewards.registry import REWARD_FUNCTIONS


def test_the_index_is_generated_from_the_current_registries():
    assert INDEX_FILE.read_text() == render(), (
        "config/registered_names.json is stale: run `python -m grpo_lightning.registered_index`"
    )


@pytest.mark.parametrize("field, where", SOURCES)
def test_a_typo_gets_the_full_paths_message(field, where):
    module, _, attribute = where.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    names = list(found.names if isinstance(found, Registry) else found)
    typo = names[0][:-1] + "x"
    if isinstance(found, Registry):
        expected = found.problem(typo, field)
    else:
        expected = []
        choice(expected, field, typo, names)
        expected = expected[0]
    if field == "task.rewards":  # the reward lookup's own message, with the fix for a plain function
        assert reward_problem(typo, field) == full_reward_problem(typo, (), field)
    else:
        assert name_problem(field, typo) == expected
    assert all(name_problem(field, name) is None for name in names)


def test_a_plugin_that_registers_a_package_class_instance_stays_out_of_the_index(tmp_path):
    """A plug-in registering ``RewardModelReward(...)`` (a package class, so a package
    ``__module__``) made the index stale for every later test in the process (CI, 2026-12-02)."""
    before = render()
    plugin = tmp_path / "package_instance_plugin.py"
    plugin.write_text(
        "from grpo_lightning.rewards import register_reward\n"
        "class Scorer:\n"
        "    def __call__(self, completions, **kw):\n"
        "        return [0.0 for _ in completions]\n"
        "Scorer.__module__ = 'grpo_lightning.rewards.fake'\n"
        "register_reward('plugin_package_instance')(Scorer())\n"
    )
    try:
        load_plugins([str(plugin)])
        assert REWARD_FUNCTIONS.origin("plugin_package_instance").startswith("grpo_lightning_plugins.")
        assert render() == before
    finally:
        REWARD_FUNCTIONS.entries.pop("plugin_package_instance", None)
