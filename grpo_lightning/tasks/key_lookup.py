"""``task=key_lookup``: one tool, ``lookup(key)``, returns a hidden value the final answer must contain.

The value is drawn from the group's reset seed, so it cannot be memorized across steps and
every episode of a group looks up the same value: the only way to answer right is to call the
tool. The episode ends on the first turn without a tool call (the answer), which earns 1 when
it contains the value (plus ``call_bonus`` when the right key was looked up).

The tools are described in the system prompt by default (``tools_in_system_prompt``), since
SmolLM2's and the tiny model's templates ignore ``tools=``; ``one_shot`` adds a worked example
in the parser's call format.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from grpo_lightning.config.base import check, option
from grpo_lightning.config.task import TASKS, task_name
from grpo_lightning.environments.base import ENVIRONMENTS, Reset, Step, Turn
from grpo_lightning.environments.limits import EpisodeTaskConfig
from grpo_lightning.environments.template_checks import describe_tools, format_call
from grpo_lightning.environments.tools import ToolEnvironment, ToolLimits
from grpo_lightning.tasks.base import Check, checked, split

WORDS = ("amber", "birch", "cobalt", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper")
WORDS += ("kestrel", "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "saffron", "tundra")
KEY_STYLES = ("words", "digits")


@dataclass
class KeyLookupTaskConfig(EpisodeTaskConfig):
    name: str = task_name("key_lookup")
    environment: str = option("key_lookup", "The environment: a name registered in ENVIRONMENTS.")
    rewards: dict[str, float] = option(
        {"environment": 1.0}, "Reward function name -> weight (environment: the task's)."
    )
    max_turns: int = option(3, "Model turns per episode at most: a call, then the answer, and one spare.")
    num_keys: int = option(200, "Distinct keys (one prompt each); val_fraction of them are held out.")
    value_digits: int = option(4, "Digits of the hidden value.")
    key_style: str = option("words", "Keys like cobalt-17 ('words') or like 117 ('digits': the tiny model's alphabet).")
    tool_parser: str = option("hermes", "How the model writes tool calls: a name registered in TOOL_PARSERS.")
    tools_in_system_prompt: bool = option(
        True, "Describe the tool in the system prompt (templates that ignore tools=); false passes tools= instead."
    )
    one_shot: bool = option(True, "Show one worked example (a call, the reply, the answer) in the system prompt.")
    question: str = option(
        "What is the value stored under the key {key}? Use the lookup tool, then answer with the value.",
        "The user's question; {key} is replaced by the key.",
    )
    call_bonus: float = option(0.0, "Reward added when the right key was looked up (shaping); 0: correctness only.")
    max_tool_output_tokens: int = option(64, "A tool reply's length at most, in tokens (longer ones are truncated).")
    model_defaults: dict[str, Any] = option(
        {
            # The tiny model's alphabet: digit keys, a question it can read, no tool text it cannot (it runs,
            # but cannot write a call: docs/environments.md#the-tiny-models-limits).
            "tiny": {
                "task.key_style": "digits",
                "task.question": "{key}?",
                "task.tools_in_system_prompt": False,
                "task.one_shot": False,
            },
            # A hermes call takes about 30 tokens; 8 episodes a step keep a step within minutes on a CPU.
            "smollm2_135m": {
                "rollout.max_new_tokens": 48,
                "rollout.num_generations": 4,
                "rollout.prompts_per_step": 2,
                "eval.num_prompts": 4,
            },
        },
        "Defaults this task brings per model: the alphabet's keys and prompt, the turn budget and the batch.",
    )

    def check_fields(self, p: str) -> list[str]:
        problems = super().check_fields(p)
        check(problems, 1 <= self.num_keys <= 100_000, f"{p}num_keys={self.num_keys} must be in [1, 100000]")
        check(problems, 1 <= self.value_digits <= 12, f"{p}value_digits={self.value_digits} must be in [1, 12]")
        check(problems, self.key_style in KEY_STYLES, f"{p}key_style={self.key_style!r}; choose one of {KEY_STYLES}")
        check(problems, "{key}" in self.question, f"{p}question must contain {{key}}, where the key goes")
        return problems


def key_name(index: int, style: str = "words") -> str:
    """The ``index``-th key: a word and a number (``cobalt-17``), or digits only (``117``)."""
    if style == "digits":
        return str(100 + index)
    return f"{WORDS[index % len(WORDS)]}-{index // len(WORDS) + 10}"


class KeyLookupEnv(ToolEnvironment):
    """One episode: the row's key holds a value drawn from the reset seed; ``lookup`` is the only tool."""

    def __init__(self, options: KeyLookupTaskConfig):
        self.options, self.key, self.value, self.looked_up = options, "", "", False

        def lookup(key: str) -> str:
            """The value stored under a key.

            Args:
                key: the key to look up, exactly as the question gives it
            """
            if key.strip() != self.key:
                raise KeyError(f"no value is stored under {key!r}")
            self.looked_up = True
            return self.value

        super().__init__(
            [lookup],
            limits=ToolLimits(max_calls_per_turn=2, max_output_tokens=options.max_tool_output_tokens, timeout_s=5.0),
        )

    def reset(self, seed: int, row: dict) -> Reset:
        options = self.options
        self.key, self.looked_up = row["key"], False
        rng = random.Random(seed)
        self.value = str(rng.randint(10 ** (options.value_digits - 1), 10**options.value_digits - 1))
        super().reset(seed, row)
        messages = [{"role": "user", "content": options.question.format(key=self.key)}]
        if options.tools_in_system_prompt:
            system = describe_tools(self.schemas, options.tool_parser)
            if options.one_shot:
                system += "\n\n" + one_shot_example(options.tool_parser)
            messages.insert(0, {"role": "system", "content": system})
        tools = [] if options.tools_in_system_prompt else self.schemas
        info = {"key": self.key, "value": self.value, "tools_in_system_prompt": options.tools_in_system_prompt}
        return Reset(messages=messages, tools=tools, info=info)

    async def step(self, turn: Turn) -> Step:
        step = await super().step(turn)
        if step.done and step.info.get("stop_reason") == "answer":
            correct = self.value in turn.text
            step.reward = float(correct) + self.options.call_bonus * self.looked_up
            step.info.update(correct=correct, success=correct, looked_up=self.looked_up)
        return step


def one_shot_example(parser: str) -> str:
    """A worked example: the call for another key, the tool's reply, and the answer."""
    call = format_call(parser, "lookup", {"key": "zebra-99"})
    return f"Example. Question: the value under zebra-99? You answer:\n{call}\nThe tool replies 5127. You answer: 5127"


@ENVIRONMENTS.register("key_lookup")
def key_lookup_env(options: KeyLookupTaskConfig, row: dict) -> KeyLookupEnv:
    return KeyLookupEnv(options)


@TASKS.register("key_lookup", options=KeyLookupTaskConfig)
def key_lookup(options: KeyLookupTaskConfig, check: Check | None = None) -> tuple[list[dict], list[dict]]:
    keys = [key_name(i, options.key_style) for i in range(options.num_keys)]
    records = [{"prompt": options.question.format(key=key), "key": key} for key in keys]
    random.Random(options.seed).shuffle(records)
    train, val = split(records, options.val_fraction)
    return checked(options.name, train, val, check)
