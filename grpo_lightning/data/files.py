"""Prompt files read with Hugging Face ``datasets``, and prompts vetted with the tokenizer.

A file is a ``.jsonl``, ``.json``, ``.parquet`` or ``.csv`` file, or a folder written by
``datasets.Dataset.save_to_disk``. A prompt is a string or a list of chat messages (TRL's
conversational format). :func:`check_prompts` rejects bad rows by file and row, with the
tokenizer but before any model loads. ``task=dataset`` (grpo_lightning/tasks/dataset.py) is
the task built on these.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from grpo_lightning.data.image_checks import check_images, has_images, text_parts
from grpo_lightning.data.images import resolve_paths
from grpo_lightning.data.prompting import PromptFormatter
from grpo_lightning.data.rows import check_text_file
from grpo_lightning.errors import ConfigError, DataError

__all__ = [
    "BUILDERS",
    "ROLES",
    "DataError",
    "check_prompts",
    "max_prompt_tokens",
    "prompt_check",
    "read_records",
    "unencodable",
]

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
ROLES = ("system", "user", "assistant")


def read_records(path: str, field: str, prompt_column: str | None) -> list[dict]:
    """The rows of ``path`` as dicts, with the prompt under ``"prompt"`` (``prompt_column`` None: the rows
    as they are, for an environment to read)."""
    import datasets  # noqa: PLC0415  (pyarrow and pandas: only when a prompt file is read, not while composing)

    source = Path(path).expanduser()
    if not source.exists():
        raise DataError(f"{field}={path!r}: no such file or folder")
    datasets.disable_progress_bars()
    if source.is_dir():
        try:
            data = datasets.load_from_disk(str(source))
        except FileNotFoundError as err:
            raise DataError(
                f"{field}={path!r} is a folder but not one written by datasets.Dataset.save_to_disk: {err}"
            ) from err
        if isinstance(data, datasets.DatasetDict):
            split = "train" if "train" in data else next(iter(data))
            data = data[split]
    else:
        builder = BUILDERS.get(source.suffix.lower())
        if builder is None:
            raise DataError(
                f"{field}={path!r}: unsupported file type {source.suffix!r}; use one of {sorted(BUILDERS)} "
                f"or a folder written by datasets.Dataset.save_to_disk"
            )
        check_text_file(source, field, path)
        try:
            with _quiet(datasets):
                data = datasets.load_dataset(builder, data_files=str(source), split="train")
        except Exception as err:
            raise DataError(f"{field}={path!r} could not be read as {builder}: {type(err).__name__}: {err}") from err
    if prompt_column is None:
        return data.to_list()
    if prompt_column not in data.column_names:
        raise DataError(
            f"{field}={path!r} has no column {prompt_column!r} (task.prompt_column); its columns are "
            f"{data.column_names}: rename the prompt column or set task.prompt_column to one of them"
        )
    records = data.to_list()
    resolve_paths(records, source if source.is_dir() else source.parent)  # image paths relative to the data
    if prompt_column != "prompt":
        for record in records:
            record["prompt"] = record.pop(prompt_column)
    for index, record in enumerate(records):
        _check_prompt_shape(record["prompt"], path, index, prompt_column)
    return records


@contextmanager
def _quiet(datasets):
    """``datasets`` logs a failed read as several error lines before raising; the raise says it once."""
    before = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL + 10)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(before)


def _check_prompt_shape(prompt, path: str, row: int, column: str) -> None:
    where = f"{path} row {row}: column {column!r}"
    if isinstance(prompt, str):
        if not prompt.strip():
            raise DataError(f"{where} is empty; give every row a prompt, or drop the row")
        return
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        for message in prompt:
            if message.get("role") not in ROLES or not _content_ok(message.get("content")):
                raise DataError(
                    f"{where}: message {str(message)[:120]!r} needs a role in {list(ROLES)} and a content: a string, "
                    "or a list of {'type': 'text', 'text': ...} and {'type': 'image'} parts"
                )
        if not any(_has_content(m["content"]) for m in prompt):
            raise DataError(f"{where}: every message is empty; give every row a prompt, or drop the row")
        return
    raise DataError(
        f"{where} must be a string or a list of chat messages [{{'role': ..., 'content': ...}}], "
        f"got {type(prompt).__name__}: {str(prompt)[:80]!r}"
    )


def _content_ok(content) -> bool:
    """A message's content: a string, or TRL's structured parts (text and image)."""
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict)
        and (p.get("type") == "image" or (p.get("type") == "text" and isinstance(p.get("text"), str)))
        for p in content
    )


def _has_content(content) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    return any(p.get("type") == "image" or p.get("text", "").strip() for p in content)


def check_prompts(records: list[dict], formatter, max_prompt_tokens: int, source: str, truncate: bool = False) -> int:
    """Reject prompts the tokenizer cannot encode or that leave no room for the completion;
    with ``truncate`` count the long ones instead (the formatter cuts them). Returns that count."""
    tokenizer = formatter.tokenizer
    too_long = 0
    char_ok: dict[str, bool] = {}
    for row, record in enumerate(records):
        prompt = record["prompt"]
        if has_images(record):  # vetted with the processor by check_images
            continue
        texts = text_parts(prompt)
        bad = unencodable(tokenizer, texts, char_ok)
        if bad:
            raise DataError(
                f"{source} row {row}: the tokenizer cannot encode the characters {bad} of prompt "
                f"{_short(prompt)} (it would turn them into {tokenizer.unk_token!r}); remove them from "
                f"the data or use a model whose tokenizer has them (the tiny model's alphabet is "
                f"model.tiny.alphabet)"
            )
        try:
            length = len(formatter.untruncated(prompt))
        except ValueError as err:  # e.g. chat messages for a tokenizer without a chat template
            raise DataError(f"{source} row {row}: {err}") from err
        if length > max_prompt_tokens and not truncate:
            raise DataError(
                f"{source} row {row}: the prompt {_short(prompt)} is {length} tokens, more than the model's "
                f"context minus rollout.max_new_tokens ({max_prompt_tokens}); shorten or drop it, lower "
                f"rollout.max_new_tokens, use a model with a longer context, or set task.truncate_prompts=true "
                f"to keep the last {max_prompt_tokens} tokens of such prompts"
            )
        too_long += length > max_prompt_tokens
    return too_long


def unencodable(tokenizer, texts, cache: dict[str, bool] | None = None) -> list[str]:
    """The characters of ``texts`` the tokenizer turns into its unknown token, sorted (none without one)."""
    unk, cache = tokenizer.unk_token_id, {} if cache is None else cache
    if unk is None:
        return []
    return sorted({c for text in texts for c in text if not _encodable(tokenizer, c, unk, cache)})


def _encodable(tokenizer, char: str, unk: int, cache: dict[str, bool]) -> bool:
    if char not in cache:
        cache[char] = unk not in tokenizer(char, add_special_tokens=False)["input_ids"]
    return cache[char]


def _short(prompt) -> str:
    text = prompt if isinstance(prompt, str) else str(prompt)
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def max_prompt_tokens(context: int | None, cfg) -> int:
    """The longest prompt that leaves room for ``rollout.max_new_tokens`` in the model's context."""
    return (context or 1 << 30) - cfg.rollout.max_new_tokens


def prompt_check(cfg, loaded: tuple | None = None):
    """``check(records, source)``: the tokenizer and context of ``cfg.model`` (loaded without
    the weights; or ``loaded``: a given tokenizer and context) against every prompt of every task;
    None if no tokenizer loads. With
    ``task.truncate_prompts`` it says how many prompts will be cut instead of stopping."""
    from lightning.pytorch.utilities import rank_zero_warn  # noqa: PLC0415  (lightning: after trainer.huge_pages)

    from grpo_lightning.models.loading import load_tokenizer  # noqa: PLC0415  (model classes: seconds, not at compose)

    try:
        tokenizer, context = loaded if loaded is not None else load_tokenizer(cfg.model)
    except ConfigError:  # a model that cannot load: said after the data, whose errors need no model
        return None
    if tokenizer is None:
        return None
    t = cfg.task
    formatter = PromptFormatter(tokenizer, t.system_prompt, t.instruction, use_chat_template=t.chat_template)
    limit = max_prompt_tokens(context, cfg)
    if limit < 1:
        raise ConfigError(
            f"rollout.max_new_tokens={cfg.rollout.max_new_tokens} does not fit the model's context of {context} "
            f"tokens (model.name_or_path={cfg.model.name_or_path!r}), which must also hold the prompt; lower "
            f"rollout.max_new_tokens well below {context}"
        )

    char_ok: dict[str, bool] = {}

    def bad_chars(texts: list[str]) -> list[str]:
        return unencodable(tokenizer, texts, char_ok)

    def check(records: list[dict], source: str) -> None:
        check_images(records, source, tokenizer, limit, cfg.model.name_or_path, bad_chars)
        cut = check_prompts(records, formatter, limit, source, truncate=t.truncate_prompts)
        if cut:
            rank_zero_warn(
                f"{source}: {cut} of {len(records)} prompts are longer than the model's context minus "
                f"rollout.max_new_tokens ({limit} tokens); task.truncate_prompts=true keeps their last {limit} tokens"
            )

    return check
