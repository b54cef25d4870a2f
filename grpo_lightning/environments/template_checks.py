"""Start-up checks of the chat template an episode is rendered with, before any step.

Two things can silently go wrong (see docs/environments.md#tools):

1. The template ignores ``tools=`` (SmolLM2's does): the model never learns the tools exist.
   :func:`check_chat_template` looks for every tool's name in a render. The remedies:
   a shipped template that renders them (:data:`SHIPPED_TEMPLATES`, by name, as the chat template
   override) or the tools described in the system prompt (:class:`ToolsInSystemPrompt`).
2. The template does not extend each turn as a prefix (Qwen3 drops earlier turns' ``<think>``
   blocks, Llama 3 trims contents, a template may count the messages up front). Training keeps
   the ids as they were sampled (the runner never re-renders them), so nothing is broken in
   training; but a chat server that re-renders the history shows the model something else than
   what it was trained on. The check plays scripted episodes through the same
   :class:`~grpo_lightning.environments.render.ChatRenderer` the runner uses and compares the
   accumulated ids with one full render; each difference is named once in a warning.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from grpo_lightning.environments.base import Message, Reset, Step, Turn, call_maybe_async
from grpo_lightning.environments.calls import first_reset
from grpo_lightning.environments.parsers import AUTO, choose_tool_parser
from grpo_lightning.environments.render import ChatRenderer

# A scripted episode: the first messages, then (sampled assistant text, the environment's reply) per turn.
PROBES: dict[str, tuple[list[Message], list[tuple[str, list[Message]]]]] = {
    "a tool reply": (
        [{"role": "user", "content": "What is stored under alpha?"}],
        [
            ("I will look it up.\n", [{"role": "tool", "name": "probe", "content": "VALUE-7"}]),
            ("The value is VALUE-7.", []),
        ],
    ),
    "a user reply after thinking": (
        [{"role": "user", "content": "Guess my number."}],
        [
            ("<think>\nStart in the middle.\n</think>\n\nIs it 50?", [{"role": "user", "content": "Higher."}]),
            ("<think>\nAbove 50 now.\n</think>\n\nIs it 75?", []),
        ],
    ),
}

CALL_FORMATS = {  # how the tools-in-system-prompt text shows a call, per parser
    "hermes": '<tool_call>\n{"name": "<tool name>", "arguments": {<argument>: <value>, ...}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=<tool name>>\n<parameter=<argument>>\n<value>\n</parameter>\n</function>\n</tool_call>",
    "llama3_json": '{"name": "<tool name>", "parameters": {<argument>: <value>, ...}}',
}

# ChatML with Hermes-style tools: for ChatML models whose own template ignores tools= (SmolLM2).
CHATML_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures, within <tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object within <tool_call></tool_call> tags:\\n' }}"
    '{{- \'<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}{%- if not (loop.first and message.role == 'system') %}"
    "{%- if message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
SHIPPED_TEMPLATES = {"chatml_tools": CHATML_TOOLS}


def resolve_chat_template(value: str | None) -> str | None:
    """A chat template override: the name of a shipped template, or Jinja text as given."""
    return SHIPPED_TEMPLATES.get(value, value) if value else None


@dataclass
class TemplateReport:
    """What the start-up check found; ``problems`` say what differs from inference, one line each."""

    renders_tools: bool | None  # None: no tools to render
    missing_tools: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    tools_in_prompt: bool = False  # the environment describes its tools in the system prompt (no tools=)
    plain: bool = False  # no chat template: contents joined as they are (nothing re-renders them at inference)

    @property
    def prefix_preserving(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        """The lines to print at start."""
        if self.renders_tools is False and self.plain:
            head = (
                "chat template: none, so the model is not shown the tools (tools= need a template that renders "
                "them; the tiny model cannot write a call: docs/environments.md#the-tiny-models-limits)"
            )
        elif self.renders_tools is False:
            head = (
                f"chat template: does not render the tools ({', '.join(self.missing_tools)} missing from a render "
                "with tools=); use the shipped template (chat_template_override=chatml_tools) or describe the tools "
                "in the system prompt"
            )
        elif self.renders_tools:
            head = "chat template: renders the tools"
        elif self.tools_in_prompt:
            head = "chat template: the tools are described in the system prompt (none passed as tools=)"
        else:
            head = "chat template: no tools offered"
        tail = ["chat template: each turn extends the last as a prefix"] if self.prefix_preserving else []
        if self.plain:
            tail = ["chat template: none (the tokenizer has none: message contents are joined as they are)"]
        return [head, *tail, *(f"chat template differs from inference: {p}" for p in self.problems)]


_WARNED: set[str] = set()


def warn_once(report: TemplateReport) -> list[str]:
    """Warn about each of ``report``'s problems once per process; returns the ones warned about now."""
    new = [p for p in report.problems if p not in _WARNED]
    for problem in new:
        _WARNED.add(problem)
        warnings.warn(
            f"the chat template is not prefix-preserving: {problem}. Training keeps the sampled ids as they were "
            "sampled; a chat server re-rendering the history would show the model a different context",
            UserWarning,
            stacklevel=2,
        )
    return new


def check_chat_template(
    renderer: ChatRenderer, tools: list[dict[str, Any]] | None = None, probes: tuple[str, ...] | None = None
) -> TemplateReport:
    """Check that ``renderer``'s template renders ``tools`` and that scripted episodes (``probes``, names of
    :data:`PROBES`; None: all) accumulate to a full render."""
    report = TemplateReport(renders_tools=None)
    if tools:
        probe = [{"role": "user", "content": "hello"}]
        text = renderer.render(probe, tools, generation_prompt=True)
        report.missing_tools = [t["function"]["name"] for t in tools if t["function"]["name"] not in text]
        report.renders_tools = not report.missing_tools and text != renderer.render(probe, None, True)
    for name, (first, turns) in PROBES.items():
        if probes is not None and name not in probes:
            continue
        problem = compare_with_render(renderer, first, turns, tools or None)
        if problem:
            report.problems.append(f"after {name}, {problem}")
    return report


def compare_with_render(
    renderer: ChatRenderer, first: list[Message], turns: list[tuple[str, list[Message]]], tools
) -> str:
    """'' when the token-in/token-out ids of a scripted episode equal a full render, else what differs."""
    stop = sorted(renderer.stop_ids)[:1]
    ids, messages = renderer.prompt_ids(first, tools), list(first)
    for text, reply in turns:
        sampled = renderer.encode(text) + stop
        ids += sampled
        messages.append({"role": "assistant", "content": text})
        ids += renderer.env_ids(sampled, reply, tools) if reply else renderer.close_ids(sampled)
        messages += reply
    full = renderer.encode(renderer.render(messages, tools))
    if ids == full:
        return ""
    # The first difference: over the common length (strict=False), else where the shorter one ends.
    at = next((i for i, (a, b) in enumerate(zip(ids, full, strict=False)) if a != b), min(len(ids), len(full)))
    before = renderer.tokenizer.decode(ids[max(0, at - 12) : at])
    trained, rendered = (renderer.tokenizer.decode(x[at : at + 24]) for x in (ids, full))
    stop_text = renderer.tokenizer.decode(stop)
    cause = _cause(turns, renderer.tokenizer.decode(full), trained, rendered, stop_text)
    return f"after {before!r} the trained ids have {trained!r} where a full render has {rendered!r}{cause}"


def _cause(turns: list[tuple[str, list[Message]]], full_text: str, trained: str, rendered: str, stop: str) -> str:
    """A known cause, named, when the texts show it."""
    if stop and trained.startswith(stop) and not rendered.startswith(stop) and stop in rendered:
        return (
            f" (the template closes a turn with text before {stop}, which the model does not sample before "
            "stopping: the trained ids go on right after the sampled stop token)"
        )
    thoughts = [t.split("</think>")[0].split("<think>")[-1].strip() for t, _ in turns if "<think>" in t]
    if any(thought not in full_text for thought in thoughts):
        return " (the template drops the <think> blocks of earlier turns)"
    if full_text.count("<think>") > sum("<think>" in t for t, _ in turns):
        return " (the template adds a <think></think> block the model did not sample)"
    if any(text != text.strip() and text not in full_text for text, _ in turns):
        return " (the template strips whitespace around message contents)"
    return ""


def describe_tools(tools: list[dict[str, Any]], parser: str = "hermes") -> str:
    """The tools and how to call them, as system-prompt text for templates that do not render ``tools=``."""
    schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    call = CALL_FORMATS.get(parser, CALL_FORMATS["hermes"])
    return f"You can call these tools:\n{schemas}\n\nTo call one, answer with exactly:\n{call}"


def format_call(parser: str, name: str, arguments: dict[str, Any]) -> str:
    """One call written the way ``parser`` reads it (for examples in prompts)."""
    if parser == "qwen3_coder":
        params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"
    if parser == "llama3_json":
        return json.dumps({"name": name, "parameters": arguments})
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ToolsInSystemPrompt:
    """An environment whose tools are described in the system prompt instead of passed as ``tools=``."""

    def __init__(self, env: Any, parser: str = "hermes"):
        self.env, self.parser = env, parser

    async def reset(self, seed: int, row: dict[str, Any]) -> Reset:
        reset: Reset = await call_maybe_async(self.env.reset, seed, row)
        if not reset.tools:
            return reset
        text = describe_tools(reset.tools, self.parser)
        messages = list(reset.messages)
        if messages and messages[0].get("role") == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}
        else:
            messages.insert(0, {"role": "system", "content": text})
        return Reset(messages=messages, tools=[], info={**reset.info, "tools_in_system_prompt": True})

    async def step(self, turn: Turn) -> Step:
        return await call_maybe_async(self.env.step, turn)

    async def close(self) -> None:
        await call_maybe_async(self.env.close)

    def __getattr__(self, name: str) -> Any:  # the optional members (max_turns, on_truncated) of the wrapped one
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)


def offered_tools(make_env: Any, row: dict[str, Any], name: str = "", timeout_s: float | None = None) -> list[dict]:
    """The tools one environment offers after a reset on ``row`` (under the step limit; one that fails,
    hangs or returns something wrong is a one-line error naming it: ``environments/calls.py``)."""
    return list(first_reset(make_env, row, name, timeout_s).tools)


def applicable_probes(renderer: ChatRenderer, uses_tools: bool) -> tuple[str, ...]:
    """The scripted episodes that can show a difference this run would meet: a tool reply only where the
    environment has tools, a thinking block only where the template or the vocabulary knows ``<think>``;
    none without a chat template (nothing re-renders plain contents at inference)."""
    if renderer.plain:
        return ()
    vocab = getattr(renderer.tokenizer, "get_vocab", dict)()
    thinks = "<think>" in renderer.chat_template or "<think>" in vocab
    return tuple(name for name, keep in (("a tool reply", uses_tools), ("a user reply after thinking", thinks)) if keep)


def startup_report(
    renderer: ChatRenderer,
    make_env: Any,
    row: dict[str, Any],
    tool_parser: str | None = AUTO,
    model_name: str = "",
    env_name: str = "",
    timeout_s: float | None = None,
) -> tuple[str | None, list[str]]:
    """What to print before the first step of a task played in an environment: the tool-call parser
    (configured, or chosen from the template and the model's name) and the template check over the
    tools one environment offers (no parser when it offers none and none is configured). Warns once about
    each template difference that this run can meet. Returns (parser or None, lines)."""
    reset = first_reset(make_env, row, env_name, timeout_s)
    tools = list(reset.tools) or None
    in_prompt = bool(reset.info.get("tools_in_system_prompt"))
    if (tool_parser or AUTO) == AUTO and not tools and not in_prompt:
        parser, line = None, "tool-call parser: none (the environment offers no tools; task.tool_parser parses anyway)"
    else:
        parser, line = choose_tool_parser(tool_parser or AUTO, model_name, renderer.chat_template)
    report = check_chat_template(renderer, tools, applicable_probes(renderer, bool(tools) or in_prompt))
    report.tools_in_prompt, report.plain = in_prompt, renderer.plain
    warn_once(report)
    return parser, [line, *report.lines()]
