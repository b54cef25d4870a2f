"""Every error the user can cause is a UserError subclass (the CLI turns it into one line and exit 2),
under its old import path; a stop by design (NaN guard, health 'raise') is not one."""

from __future__ import annotations

import pytest

from grpo_lightning import errors
from grpo_lightning.data.files import DataError
from grpo_lightning.health.alerts import Alert, HealthCheckError
from grpo_lightning.models.smollm2 import MissingPackageError
from grpo_lightning.rewards.scorer import RewardFunctionError
from grpo_lightning.rollout.engine import EngineError
from grpo_lightning.rollout.vllm_server import VLLMServerError
from grpo_lightning.step.guards import NonFiniteTrainingError


@pytest.mark.parametrize(
    "cls, base, builtin",
    [
        (DataError, errors.DataError, ValueError),
        (EngineError, errors.ServerError, RuntimeError),
        (VLLMServerError, errors.ServerError, RuntimeError),
        (RewardFunctionError, errors.RewardError, RuntimeError),
        (MissingPackageError, errors.UserError, ImportError),
    ],
)
def test_user_errors_sit_in_the_hierarchy_and_keep_their_builtin_base(cls, base, builtin):
    assert issubclass(cls, base) and issubclass(cls, errors.UserError)
    assert issubclass(cls, builtin)  # callers that caught the builtin still catch it
    assert cls.exit_code == 2


def test_the_data_error_is_one_class():
    assert DataError is errors.DataError


@pytest.mark.parametrize("cls", [NonFiniteTrainingError, HealthCheckError])
def test_a_stop_by_design_is_not_a_user_error(cls):
    assert issubclass(cls, errors.TrainingStopped) and issubclass(cls, RuntimeError)
    assert not issubclass(cls, errors.UserError)
    assert cls.exit_code == 3


def test_a_health_stop_carries_the_whole_diagnosis():
    alert = Alert("diversity", "F1", "collapse", 7, "all equal", "lr too high", "lower algorithm.lr")
    err = HealthCheckError(alert)
    assert err.alert is alert
    assert "F1 collapse" in str(err) and "step 7" in str(err) and "Try: lower algorithm.lr" in str(err)
