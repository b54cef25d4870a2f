"""A vision-language student's teacher sees its images (step/teachers/, models/vision/forward.py): the teacher's
log-probs in a step equal a direct Hugging Face forward of the teacher on the same images, prompt and
completion (both families, prompts with 1-3 images, packed or padded, micro-batch boundaries at random); a
teacher identical to the student teaches nothing (KL, advantages and the JSD 0, argmax agreement 1); a context
teacher reads the student's prompt with its own system prompt, the images in the user's message."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.vision import FAMILIES, load_folder, random_records, vision_generator

from grpo_lightning.config import AlgorithmConfig, ConfigError, LoraModelConfig, TrainConfig
from grpo_lightning.data.vision_prompting import VisionPrompts
from grpo_lightning.models.lora import apply_lora
from grpo_lightning.models.teacher import load_teacher_model
from grpo_lightning.models.vision.processor import processor_of
from grpo_lightning.models.vision.tiny import IMAGE, build_tiny_processor, build_vision_tokenizer, chat_template
from grpo_lightning.step.module import GRPOModule
from grpo_lightning.step.teachers.base import LoraBaseTeacher
from grpo_lightning.step.teachers.context import ContextTeacher, SystemSwap
from grpo_lightning.step.teachers.folder import FolderTeacher

# float32 on a CPU: the step's chunked, packed pass and HF's own forward differ by summation order only
# (measured below 1e-6); a missing image, a wrong pixel or a position counted from 0 moves them by 1e-2 and more.
TOLERANCE = 1e-5
SYSTEM = "Look at the picture closely."


def algorithm(objective: str, kind: str = "folder", **fields) -> AlgorithmConfig:
    cfg = AlgorithmConfig(beta=0.0, **fields)
    cfg.teacher.kind, cfg.teacher.objective = kind, objective
    return cfg


def direct_logprobs(model, batch, row: int, prompt: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs of the completion's tokens, the argmax at each) of one row: HF's forward of the whole VLM on
    the row's ids and its images' tensors, written out over full logits; None when the completion sampled an
    image token (HF's forward would take it for an image's)."""
    if prompt is None:
        prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()]
    completion = batch.completion_ids[row][batch.completion_mask[row].bool()]
    image = model.config.image_token_id
    if bool((completion == image).any()):
        return None
    ids = torch.cat([prompt, completion])[None]
    extra = {}
    if model.config.model_type == "qwen2_vl":  # M-RoPE: which tokens are an image's
        extra["mm_token_type_ids"] = (ids == image).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), **batch.vision[row].tensors, **extra).logits
    logits = logits[0, len(prompt) - 1 : -1].double() / batch.temperature
    return torch.log_softmax(logits, -1).gather(-1, completion[:, None])[:, 0], logits.argmax(-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_vlm_teachers_logprobs_are_a_direct_forward_on_the_same_images(family, tiny_vlm_folders):
    policy, tokenizer = load_folder(tiny_vlm_folders[family])
    teacher = load_teacher_model(tiny_vlm_folders[family], "auto")  # loaded as a teacher folder is, then moved
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # other weights, vision side included: the teacher is not the student
        for p in teacher.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    rng = random.Random(f"vlm-teacher-{family}")
    checked = 0
    for case in range(2):
        batch = vision_generator(
            policy, tokenizer, 2, max_new_tokens=rng.randint(2, 5), temperature=rng.choice([0.7, 1.0])
        ).generate(random_records(rng, rng.randint(1, 3)), step=case, rank=0)
        cfg = algorithm("jsd", pack_sequences=rng.random() < 0.5, micro_batch_size=rng.randint(1, batch.num_sequences))
        module = GRPOModule(policy, cfg, teacher=FolderTeacher(cfg, teacher))
        cache = module.distill.teacher.forward.vision.cache
        before = cache.computed
        prepared = module.prepare(batch)
        scores = module.distill.scores
        assert cache.computed - before == batch.num_groups  # once per prompt per pass, not per sample
        assert len(scores.rows) == len(prepared.micro_batches)  # the JSD's hidden rows, per micro-batch
        for row in range(batch.num_sequences):
            direct = direct_logprobs(teacher, batch, row)
            if direct is None:
                continue
            want, argmax = direct
            got = prepared.teacher.logp[row, : len(want)].double()
            assert float((got - want).abs().max()) <= TOLERANCE, f"case {case} row {row}"
            assert scores.argmax[row, : len(want)].tolist() == argmax.tolist()
            checked += 1
    assert checked >= 4


@pytest.mark.parametrize("kind", ["folder", "base"])
def test_a_teacher_that_is_the_student_teaches_nothing(kind, tiny_vlm_folders):
    """The student's own folder (JSD) and a LoRA student's base at the start (sampled reverse KL): KL 0,
    advantages 0, the divergence 0, argmax agreement 1, and the images seen (a teacher blind to them would
    disagree)."""
    folder = tiny_vlm_folders["qwen2_vl"]
    policy, tokenizer = load_folder(folder)
    batch = vision_generator(policy, tokenizer, 2, max_new_tokens=4).generate(
        random_records(random.Random("same"), 2), step=0, rank=0
    )
    if kind == "folder":
        cfg = algorithm("jsd", pack_sequences=True, micro_batch_size=3)
        teacher = FolderTeacher(cfg, load_teacher_model(folder, "auto"))
    else:
        policy = apply_lora(policy, LoraModelConfig(rank=4))
        cfg = algorithm("reverse_kl", kind="base", micro_batch_size=3)
        teacher = LoraBaseTeacher(cfg, policy)
    module = GRPOModule(policy, cfg, teacher=teacher)
    prepared = module.prepare(batch)
    module.accumulate_gradients(batch, prepared)
    metrics = module.distill.metrics(lambda x: x)
    assert abs(metrics["distill/kl"]) < 1e-6 and abs(metrics["distill/kl_k3"]) < 1e-6
    assert abs(metrics["distill/advantage_mean"]) < 1e-6
    assert metrics.get("distill/divergence", 0.0) < 1e-6
    assert metrics["distill/argmax_agreement"] == 1.0
    assert torch.isfinite(torch.tensor(list(metrics.values()))).all()


def test_a_vlm_context_teacher_reads_the_students_prompt_under_its_system_prompt(tiny_vlm_folders):
    policy, tokenizer = load_folder(tiny_vlm_folders["llava"])
    rng = random.Random("context")
    records = random_records(rng, 2)
    batch = vision_generator(policy, tokenizer, 2, max_new_tokens=3).generate(records, step=0, rank=0)
    cfg = TrainConfig()
    cfg.algorithm.beta, cfg.algorithm.teacher.kind, cfg.algorithm.teacher.context.system_prompt = 0.0, "context", SYSTEM
    teacher = ContextTeacher.from_config(cfg, tokenizer, policy)
    module = GRPOModule(policy, cfg.algorithm, teacher=teacher)
    tower = [p for p in policy.parameters() if not p.requires_grad]  # a folder's tower is frozen: shared
    assert tower and all(any(p is q for q in teacher._frozen.parameters()) for p in tower)
    prepared = module.prepare(batch)
    theirs = VisionPrompts(processor_of(tokenizer), SYSTEM)
    image = tokenizer.convert_tokens_to_ids(IMAGE)
    for row in range(batch.num_sequences):
        ids, vision = theirs(records[row // 2])
        assert vision.num_images == batch.vision[row].num_images and ids.count(image) == vision.num_image_tokens
        assert tokenizer.decode(ids).count(SYSTEM) == 1  # the student's prompt has no system prompt
        direct = direct_logprobs(policy, batch, row, torch.tensor(ids))
        if direct is not None:
            got = prepared.teacher.logp[row, : len(direct[0])].double()
            assert float((got - direct[0]).abs().max()) <= TOLERANCE, row


def test_a_chat_template_whose_system_prompt_is_not_a_block_of_its_own_is_refused():
    """The system text rendered after the user's message: swapping the leading block cannot make the
    teacher's prompt, and the run is refused in one line naming the fix."""
    tokenizer = build_vision_tokenizer("llava")
    processor = build_tiny_processor(tokenizer, "llava", 32, 8)
    SystemSwap(processor, None, SYSTEM).check()  # the tiny template: a block of its own
    processor.chat_template = (
        "{%- for m in messages if m['role'] != 'system' -%}"
        + chat_template("llava")[len("{%- for m in messages -%}") :]
    ).replace(
        "{%- if add_generation_prompt -%}",
        "{%- for m in messages if m['role'] == 'system' -%}"
        "{{ m['content'][0]['text'] }}{%- endfor -%}{%- if add_generation_prompt -%}",
    )
    with pytest.raises(ConfigError, match="does not render the system prompt as a block of its own.*folder teacher"):
        SystemSwap(processor, None, SYSTEM).check()
