"""A teacher checked at start-up (models/teacher.py, step/teachers/checks.py): its tokenizer against the
student's, the first difference named; its context against the rollout; and the memory estimate counting
it. Each refusal is one line."""

from __future__ import annotations

import pytest
from PIL import Image

from grpo_lightning.build import build_datamodule
from grpo_lightning.config import TrainConfig
from grpo_lightning.errors import ConfigError
from grpo_lightning.models import build_char_tokenizer, build_tiny_policy
from grpo_lightning.models.memory import model_shape, step_bytes
from grpo_lightning.models.teacher import tokenizer_difference
from grpo_lightning.models.vision.tiny import build_tiny_vlm, build_vision_tokenizer
from grpo_lightning.step.teachers.checks import check_teacher


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Teacher folders: the student's tokenizer, another alphabet, a context of 6 tokens."""
    root = tmp_path_factory.mktemp("teachers")
    made = {}
    for name, alphabet, context in (("same", None, 128), ("other", "0123456789+-=? ", 128), ("short", None, 6)):
        tokenizer = build_char_tokenizer(alphabet) if alphabet else build_char_tokenizer()
        build_tiny_policy(tokenizer, max_position_embeddings=context).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        made[name] = str(root / name)
    return made


def config(**teacher) -> TrainConfig:
    cfg = TrainConfig()
    for key, value in teacher.items():
        setattr(cfg.algorithm.teacher, key, value)
    return cfg


def refusal(cfg: TrainConfig) -> str:
    with pytest.raises(ConfigError) as err:
        check_teacher(cfg, build_datamodule(cfg).train_records)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_the_first_difference_of_two_tokenizers_is_named():
    student = build_char_tokenizer()
    assert tokenizer_difference(student, build_char_tokenizer()) is None
    assert tokenizer_difference(student, build_char_tokenizer("0123456789+-=? ")) == (
        "the student's token '*' is id 15, the teacher has no such token"
    )
    assert tokenizer_difference(student, build_char_tokenizer("1023456789+-*=? ")) == (
        "the student's token '0' is id 3, the teacher has it as id 4"
    )
    assert "not in the student's vocabulary" in tokenizer_difference(student, build_char_tokenizer("0123456789+-*=? x"))
    other = build_char_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<tool>"]})
    assert "'<tool>'" in tokenizer_difference(student, other)


def test_a_teacher_of_the_students_tokenizer_and_context_passes(folders):
    check_teacher(config(path=folders["same"]), build_datamodule(config()).train_records)


def test_a_teacher_of_another_tokenizer_is_refused(folders):
    said = refusal(config(path=folders["other"]))
    assert said.startswith("the teacher's tokenizer (algorithm.teacher.path=") and "'*' is id 15" in said
    assert "cross-tokenizer distillation is not supported" in said


def test_a_teacher_context_shorter_than_the_rollout_is_refused(folders):
    said = refusal(config(path=folders["short"]))
    assert "the teacher's context is 6 tokens" in said and "rollout.max_new_tokens=4" in said


VLM_RECORDS = [{"prompt": [{"role": "user", "content": "how many?"}]}]


@pytest.fixture(scope="module")
def vlm_teachers(tmp_path_factory, tiny_vlm_folders) -> dict[str, str]:
    """Vision-language teacher folders: each family's (the tiny VLM's processor), and a LLaVA whose processor
    makes 64-pixel images (more image tokens than the student's)."""
    root, made = tmp_path_factory.mktemp("vlm_teachers"), dict(tiny_vlm_folders)
    for name, image_size, context in (("llava64", 64, 256), ("short", 32, 40)):
        model, processor = build_tiny_vlm(build_vision_tokenizer("llava"), "llava", image_size=image_size)
        model.config.text_config.max_position_embeddings = context
        model.save_pretrained(root / name)
        processor.save_pretrained(root / name)
        made[name] = str(root / name)
    return made


def vlm_config(**teacher) -> TrainConfig:
    cfg = config(**teacher)
    cfg.model.name_or_path = "tiny_vlm"  # LLaVA
    return cfg


def test_a_vlm_teacher_of_the_students_family_and_processor_passes(vlm_teachers):
    check_teacher(vlm_config(path=vlm_teachers["llava"]), VLM_RECORDS)
    cfg = vlm_config(kind="context")
    cfg.algorithm.teacher.context.system_prompt = "Count the shapes."
    check_teacher(cfg, VLM_RECORDS)
    check_teacher(vlm_config(kind="base"), VLM_RECORDS)


def test_a_vlm_teachers_context_counts_the_image_tokens_and_its_system_prompt(vlm_teachers):
    """A teacher folder of a shorter context, and a context teacher whose system prompt makes the prompt it reads
    longer than the policy's context: the prompts are measured with their images' tokens."""
    records = [{"prompt": [{"role": "user", "content": "how many?"}], "images": [Image.new("RGB", (20, 20))]}]
    with pytest.raises(ConfigError, match=r"context is 40 tokens \(algorithm.teacher.path=.*\d+ prompt tokens"):
        check_teacher(vlm_config(path=vlm_teachers["short"]), records)
    cfg = vlm_config(kind="context")
    cfg.algorithm.teacher.context.system_prompt = "Count. " * 40  # 280 characters: past the tiny VLM's 256
    with pytest.raises(
        ConfigError, match="context is 256 tokens \\(the policy with algorithm.teacher.context's system"
    ):
        check_teacher(cfg, records)


@pytest.mark.parametrize(
    "case",
    ["text teacher", "vlm teacher of a text student", "another family", "another processor", "server", "prefix"],
)
def test_a_teacher_that_cannot_see_what_the_student_sees_is_refused_in_one_line(case, folders, vlm_teachers):
    cfg = vlm_config()
    t = cfg.algorithm.teacher
    if case == "text teacher":
        t.path, said = folders["same"], "is a text-only model (llama) and the student"
        fix = "use a vision-language teacher of the student's family, algorithm.teacher.kind=base"
    elif case == "vlm teacher of a text student":
        cfg, said, fix = config(path=vlm_teachers["llava"]), "is a vision-language model (llava)", "use a text teacher"
    elif case == "another family":
        t.path, said, fix = vlm_teachers["qwen2_vl"], "is a qwen2_vl model and the student", "of the student's family"
    elif case == "another processor":
        t.path, said = (
            vlm_teachers["llava64"],
            "image_processor.crop_size.height is 32 for the student, 64 for the teacher",
        )
        fix = "saved with the student's processor"
    elif case == "server":
        t.kind, t.server.url = "server", "http://127.0.0.1:9"
        said, fix = "kind=server with a vision-language policy", "use a local teacher"
    else:
        t.kind, t.context.prefix = "context", "1+1=2 "
        said, fix = "prefix/prefix_file with a vision-language policy", "algorithm.teacher.context.system_prompt"
    with pytest.raises(ConfigError) as err:
        check_teacher(cfg, VLM_RECORDS if cfg.model.name_or_path == "tiny_vlm" else [{"prompt": "1+1="}])
    line = str(err.value)
    assert "\n" not in line and said in line and fix in line, line


def test_a_context_teacher_counts_its_prefix_in_the_context():
    cfg = config(kind="context")
    cfg.algorithm.teacher.context.prefix = "1+1=2 " * 25  # 150 characters: past the tiny model's 128
    assert "the teacher's context is 128 tokens" in refusal(cfg)


def test_the_memory_estimate_counts_a_third_model(folders):
    shape = model_shape(TrainConfig().model)
    weights = shape.params * shape.bytes_per_param
    assert "teacher weights" not in step_bytes(TrainConfig(), shape)
    assert step_bytes(config(path=folders["same"]), shape)["teacher weights"] == weights  # beside the reference
    copy = config(kind="context")
    copy.algorithm.beta = 0.0  # no reference to share: a frozen copy of the policy
    assert step_bytes(copy, shape)["teacher weights"] == weights
    assert "teacher weights" not in step_bytes(config(kind="context"), shape)  # the reference is the teacher
    assert "teacher weights" not in step_bytes(config(path=folders["same"], device="cuda:1"), shape)
