"""vLLM with a vision-language policy: the same token-in/token-out contract as text.

* **Prompts.** The trainer's prompt ids hold each image expanded into its run of image tokens.
  vLLM expands images itself, so each run goes in as one image token with the images as
  ``multi_modal_data``; the ids vLLM reports back after its own expansion must be the trainer's,
  or the engine stops (different image-processor settings would put the features at other places).
  A vLLM server takes the same collapsed ids on its token-in/token-out route
  (``/inference/v1/generate``) with the images as ``content_parts`` (PNG data URLs: lossless, so
  its processor reads our pixels), renders them as ``LLM.generate`` does, and returns the expanded
  prompt ids (``return_token_ids``), checked the same way. A prompt's images are encoded once for
  its G requests.
* **Weights.** vLLM's loader takes the names of the Hub's checkpoints; a family renames where
  transformers 5 differs (LLaVA's tower, :meth:`VisionFamily.engine_name`), in the engine's first
  folder (a launched server's too) and in every sync. A frozen vision side is pushed once: it never
  changes.
* **Caches.** vLLM keeps image embeddings in an encoder cache keyed by the image alone: after a
  sync that may change the tower, the cache is reset with the prefix cache, or old features of a
  seen image would be reused (a server's through ``POST /reset_encoder_cache``).
* **Without torchvision** (this project's CPU setup): vLLM's model files import helpers from
  transformers' torchvision-backed image-processing modules; :mod:`grpo_lightning.models.vision.compat`
  aliases them to the PIL ones, and the families' vLLM classes are registered in this process (vLLM
  would inspect them in a fresh interpreter, without the aliases); a launched server's processes, which
  vLLM spawns afresh, do the same through a vLLM plugin (:func:`server_plugin_env`). The Qwen2-VL
  family's processing in vLLM needs transformers' video processor, which needs torchvision: it is
  refused, in one line.
"""

from __future__ import annotations

import base64
import io
import os
import threading
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from grpo_lightning.errors import ConfigError
from grpo_lightning.models.lora import is_peft_model, merged_state_dict
from grpo_lightning.models.vision import compat
from grpo_lightning.models.vision.families import VisionFamily, family_of, is_vision_config
from grpo_lightning.rollout.engine import Completion, EngineError, GenerationRequest

NEEDS_TORCHVISION = ("qwen2_vl", "qwen2_5_vl")
PNG_MODES = ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA")  # what Pillow writes as PNG unchanged


def is_vision_policy(policy) -> bool:
    return is_vision_config(getattr(policy, "config", None))


def refuse_unsupported(model_type: str | None, rollout=None) -> None:
    """ConfigError, before the model loads (and at the engine's start), for what vLLM cannot do here with a
    vision-language policy of ``model_type`` (None: a text policy, nothing to refuse)."""
    if model_type is None:
        return
    if model_type in NEEDS_TORCHVISION and not compat.torchvision_installed():
        raise ConfigError(
            f"rollout.engine=vllm: vLLM 0.32 processes {model_type} images with transformers' video processor, "
            "which needs torchvision (uninstalled here, docs/vllm.md); use rollout.engine=hf, a LLaVA-family "
            "model, or install the CPU build of torchvision that matches torch"
        )
    if rollout is not None and rollout.mode == "async":
        raise ConfigError(
            "rollout.mode=async: a vision-language policy generates synchronously only (its queued requests "
            "carry images, which a checkpoint of the generations in flight cannot hold yet); set rollout.mode=sync"
        )
    if rollout is not None and not rollout.uses_server and not rollout.vllm.in_process:
        raise ConfigError(
            "rollout.vllm.in_process=false: a vision-language policy's images reach no separate engine process "
            "here (docs/vision.md); set rollout.vllm.in_process=true, or serve it with rollout.vllm.server.launch=true"
        )


def prepare_vllm(policy) -> None:
    """Make vLLM able to load ``policy``'s family here; ConfigError for a family it cannot run without torchvision."""
    refuse_unsupported(getattr(policy.config, "model_type", None))
    compat.serve_vision()


def engine_names(policy, tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``tensors`` under the names vLLM's loader takes (a text policy's as they are)."""
    if not is_vision_policy(policy):
        yield from tensors
        return
    family = family_of(policy)
    for name, tensor in tensors:
        yield family.engine_name(name), tensor


PLUGIN = "grpo_vision_compat"  # the vLLM general plugin of a launched server for a vision-language policy
_PLUGIN_MODULE = '''"""vLLM general plugin written by grpo_lightning: serve a vision-language policy without torchvision."""
import importlib.util


def serve_vision():
    spec = importlib.util.spec_from_file_location("grpo_vision_compat_module", {path!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.serve_vision()
'''


def server_plugin_env(folder: str | Path) -> dict[str, str]:
    """The environment of a launched vLLM server that serves a vision-language policy here: a vLLM general
    plugin (an entry point in ``folder``, put on its PYTHONPATH) that runs :func:`compat.serve_vision` in each
    of its processes, which vLLM spawns afresh (the patches of the launching process would not reach them).
    The plugin imports no part of this package: it loads compat.py by its path. Nothing with torchvision."""
    if compat.torchvision_installed():
        return {}
    folder = Path(folder)
    (folder / f"{PLUGIN}.py").write_text(_PLUGIN_MODULE.format(path=str(Path(compat.__file__).resolve())))
    info = folder / f"{PLUGIN}-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{PLUGIN} = {PLUGIN}:serve_vision\n")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)}
    if os.environ.get("VLLM_PLUGINS"):  # a list of allowed plugins: ours joins it
        env["VLLM_PLUGINS"] = f"{os.environ['VLLM_PLUGINS']},{PLUGIN}"
    return env


def frozen_vision_names(policy) -> set[str]:
    """The vision-side weights that never change (frozen, no adapter): pushed with the first sync only."""
    if not is_vision_policy(policy) or is_peft_model(policy):
        return set()
    prefixes = family_of(policy).vision_prefixes
    return {n for n, p in policy.named_parameters() if n.startswith(prefixes) and not p.requires_grad}


def write_engine_weights(policy, folder: str | Path) -> None:
    """The engine's folder holds the weights under vLLM's names (one safetensors file)."""
    folder = Path(folder)
    for old in [*folder.glob("*.safetensors"), *folder.glob("*.safetensors.index.json")]:
        old.unlink()
    state = {name: t.detach().contiguous() for name, t in engine_names(policy, merged_state_dict(policy).items())}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})


def collapsed(ids: list[int], image_token: int, counts: list[int]) -> list[int]:
    """One image token per image, ``counts`` the image tokens of each image in order (images side by
    side make one run of tokens): vLLM expands every image itself."""
    out, index, pending = [], 0, 0
    for token in ids:
        if token != image_token:
            out.append(token)
            continue
        if pending == 0:
            if index >= len(counts):
                raise EngineError(f"a prompt holds more image tokens than its {len(counts)} image(s) fill")
            out.append(token)
            pending = counts[index]
            index += 1
        pending -= 1
    return out


@dataclass(frozen=True)
class EngineVision:
    """What an engine needs to know of a vision-language policy to build its prompts."""

    image_token_id: int
    family: VisionFamily
    config: Any  # the policy's config
    # A prompt's images as data URLs, made once for its G requests (they share one VisionInputs).
    _urls: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def of(cls, policy) -> EngineVision | None:
        if not is_vision_policy(policy):
            return None
        return cls(int(policy.config.image_token_id), family_of(policy), policy.config)

    def prompt(self, request: GenerationRequest):
        """The vLLM prompt of a request: its ids, with its images as multimodal data where it has some."""
        from vllm.inputs import TokensPrompt  # noqa: PLC0415 - vLLM loads only with rollout.engine=vllm

        vision = request.vision
        if vision is None or not vision.num_images:
            return TokensPrompt(prompt_token_ids=list(request.prompt_ids))
        return TokensPrompt(
            prompt_token_ids=self.collapsed_ids(request),
            multi_modal_data={"image": vision.images if vision.num_images > 1 else vision.images[0]},
        )

    def collapsed_ids(self, request: GenerationRequest) -> list[int]:
        """The request's prompt ids with each image's run of image tokens collapsed to one."""
        counts = self.family.image_tokens(self.config, request.vision)
        return collapsed(list(request.prompt_ids), self.image_token_id, counts)

    def server_prompt(self, request: GenerationRequest) -> dict:
        """A request with images as a vLLM server's ``/inference/v1/generate`` takes it: the collapsed ids and
        one ``image_url`` content part per image, in order."""
        with self._lock:  # the group's requests run on several threads: one of them encodes
            urls = self._urls.get(request.vision)
            if urls is None:
                urls = self._urls[request.vision] = [image_url(image) for image in request.vision.images]
        return {
            "token_ids": self.collapsed_ids(request),
            "content_parts": [{"type": "image_url", "url": u} for u in urls],
        }


def image_url(image) -> str:
    """A PIL image as a PNG data URL: lossless, so a server's image processor reads the trainer's pixels."""
    if image.mode not in PNG_MODES:  # CMYK, YCbCr, ...: converted as the image processors convert them
        image = image.convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def checked_prompt(request: GenerationRequest, engine_ids: list[int], completion: Completion) -> Completion:
    """The completion, once vLLM's expansion of the prompt is the trainer's (token in, token out)."""
    if request.vision is not None and list(engine_ids) != list(request.prompt_ids):
        raise EngineError(
            f"vLLM expanded a prompt's {request.vision.num_images} image(s) into {len(engine_ids)} prompt tokens, "
            f"the trainer's processor into {len(request.prompt_ids)}: the two image processors' settings differ "
            "(e.g. min_pixels / max_pixels); the engine's folder must hold the policy's processor"
        )
    return completion
