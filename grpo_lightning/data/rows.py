"""Check a text prompt file line by line before ``datasets`` reads it.

``datasets`` reports a bad row as "An error occurred while generating the dataset" (plus logged
tracebacks), accepts a column whose rows hold different JSON types, and gives no row numbers.
Here an empty file, bytes that are not UTF-8, a line that is not a JSON object, a column of
mixed types, and a CSV row with more or fewer fields than its header (pandas fills the missing
ones with null without a word) or a quote never closed each raise one
:class:`~grpo_lightning.errors.DataError` naming the file and the line (1-based, as editors show
it) and row (0-based, as the other prompt checks say it).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from grpo_lightning.errors import DataError

TEXT_SUFFIXES = (".jsonl", ".json", ".csv")
_SHOWN_ROWS = 5  # rows listed per type in a mixed-type message


def check_text_file(source: Path, field: str, path: str) -> None:
    """Raise DataError for the first problem of a .jsonl / .json / .csv file ``source``."""
    suffix = source.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        return
    where = f"{field}={path!r}"
    raw = source.read_bytes()
    if not raw.strip():
        raise DataError(f"{where} is empty: it has no rows; give it one prompt per row")
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as err:
            raise DataError(
                f"{where} line {number}{_row(suffix, number)}: byte {line[err.start : err.start + 1]!r} at column "
                f"{err.start + 1} is not UTF-8; save the file as UTF-8"
            ) from err
    if suffix == ".csv":
        _check_csv(raw.decode("utf-8"), where)
    elif suffix == ".jsonl":
        rows = [_json_line(line, number, where) for number, line in enumerate(lines, start=1) if line.strip()]
        _check_column_types(rows, where)
    elif suffix == ".json":
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise DataError(f"{where} line {err.lineno}: not valid JSON ({err.msg}); fix that line") from err
        if isinstance(data, list) and all(isinstance(row, dict) for row in data):
            _check_column_types(data, where)


def _check_csv(text: str, where: str) -> None:
    """Every row has its header's number of fields, every quote is closed (as Python's csv reads it)."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    row, start = -1, 1
    try:
        for record in reader:
            line, start = start, reader.line_num + 1  # the record's first line; the next one's
            if not record:  # a blank line: pandas skips it too
                continue
            if header is None:
                header = record
                continue
            row += 1
            if len(record) != len(header):
                fix = "quote a field that holds a comma" if len(record) > len(header) else "give the row every column"
                raise DataError(
                    f"{where} line {line} (row {row}): {len(record)} field{'s' * (len(record) != 1)} where the "
                    f"header has {len(header)} "
                    f"({', '.join(header)}); {fix}"
                )
    except csv.Error as err:
        raise DataError(
            f'{where} line {start} (row {row + 1}): {err}; close the quote (a quote inside a field is written "")'
        ) from None


def _row(suffix: str, line: int) -> str:
    """The 0-based row of a 1-based line: .jsonl rows are lines, a .csv's first line is its header."""
    if suffix == ".jsonl":
        return f" (row {line - 1})"
    return f" (row {line - 2})" if suffix == ".csv" and line > 1 else ""


def _json_line(line: bytes, number: int, where: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{where} line {number} (row {number - 1}): not valid JSON ({err.msg} at column {err.colno}); "
            "each line must be one JSON object"
        ) from err
    if not isinstance(row, dict):
        raise DataError(
            f"{where} line {number} (row {number - 1}): a JSON object {{...}} expected, got {type(row).__name__}"
        )
    return row


def _kind(value) -> str | None:
    if value is None:
        return None  # a missing value fits any column
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _check_column_types(rows: list[dict], where: str) -> None:
    """Every column holds one JSON type (numbers count as one, nulls fit any)."""
    kinds: dict[str, dict[str, list[int]]] = {}
    for index, row in enumerate(rows):
        for column, value in row.items():
            kind = _kind(value)
            if kind is not None:
                kinds.setdefault(column, {}).setdefault(kind, []).append(index)
    for column, by_kind in kinds.items():
        if len(by_kind) > 1:
            said = "; ".join(
                f"{kind} in rows {found[:_SHOWN_ROWS]}{' ...' if len(found) > _SHOWN_ROWS else ''}"
                for kind, found in sorted(by_kind.items(), key=lambda item: -len(item[1]))
            )
            raise DataError(
                f"{where}: column {column!r} mixes types ({said}); give every row the same type, e.g. quote the numbers"
            )
