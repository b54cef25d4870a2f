"""algorithm.corrections from the command line: names, options nodes, and the refused combinations."""

from __future__ import annotations

import pytest

from grpo_lightning.algorithm.corrections import selected_corrections
from grpo_lightning.config.compose import compose
from grpo_lightning.config.train import validate_config
from grpo_lightning.errors import ConfigError


def _validated(*overrides: str):
    cfg, _ = compose(["trainer.output_dir=/tmp/corrections-config", *overrides])
    validate_config(cfg)
    return cfg


def test_a_list_of_corrections_with_their_options_composes():
    cfg = _validated(
        "algorithm.corrections=[icepop,geo_mask]",
        "algorithm.icepop.upper=4",
        "algorithm.geo_mask.lower=0.99",
        "algorithm.geo_mask.upper=1.01",
    )
    built = selected_corrections(cfg.algorithm)
    assert [c.name for c in built] == ["icepop", "geo_mask"]
    assert built[0].band().high == 4.0 and built[1].band().low == 0.99


def test_the_deprecated_is_level_still_selects_tis_with_is_cap():
    cfg = _validated("algorithm.is_level=sequence", "algorithm.is_cap=5")
    (tis,) = selected_corrections(cfg.algorithm)
    assert tis.name == "tis_seq" and tis.options.cap == 5.0


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (["algorithm.corrections=[geo_mask]"], ["algorithm.geo_mask.lower is required"]),
        (["algorithm.corrections=[opsm]"], ["algorithm.opsm.delta is required"]),
        (["algorithm.corrections=[rejection]"], ["algorithm.rejection.upper is required"]),
        (["algorithm.corrections=[tis_token]", "algorithm.policy_loss=gspo"], ["per token", "gspo"]),
        (["algorithm.corrections=[mis_token]", "algorithm.correction_mode=bypass"], ["double-counts"]),
        (["algorithm.corrections=[icepo]"], ["did you mean 'icepop'"]),
        (["algorithm.corrections=[veto,veto]"], ["twice"]),
        (["algorithm.is_level=token", "algorithm.corrections=[tis_token]"], ["deprecated"]),
        (["algorithm.corrections=[icepop]", "algorithm.icepop.lower=6"], ["algorithm.icepop.upper=5.0 must be >"]),
        (["rollout.top_k=20", "algorithm.truncated_sampling=refuse"], ["log(kept mass)"]),
    ],
)
def test_senseless_settings_are_refused_at_config_time(overrides, words):
    with pytest.raises(ConfigError) as err:
        _validated(*overrides)
    for word in words:
        assert word in str(err.value)


def test_sequence_corrections_pass_under_gspo_and_masks_under_bypass():
    _validated("algorithm.corrections=[tis_seq,k3_seq_mask]", "algorithm.policy_loss=gspo")
    _validated("algorithm.corrections=[veto,opsm]", "algorithm.opsm.delta=0.5", "algorithm.correction_mode=bypass")
