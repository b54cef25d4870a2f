"""Prompt text -> token ids: the chat template, a system prompt and the answer instruction.

Why a separate piece: instruction-tuned models (SmolLM2-Instruct) answer well only inside
their chat template, while the tiny character model has none and must see the raw prompt.
One formatter used by the rollout callback and the evaluator keeps training and evaluation
prompts identical.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class PromptFormatter:
    """Builds the model's input for one question.

    ``instruction`` is appended to the question (e.g. "Answer with <answer>N</answer>");
    with a chat template the result is the user turn, after ``system_prompt`` if given,
    followed by the assistant header (``add_generation_prompt``). Without a template (or
    with ``use_chat_template=False``) the text is tokenized as is.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        system_prompt: str | None = None,
        instruction: str = "",
        use_chat_template: bool = True,
    ):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.instruction = instruction
        self.uses_chat_template = bool(use_chat_template and getattr(tokenizer, "chat_template", None))

    def user_text(self, question: str) -> str:
        return f"{question}\n{self.instruction}" if self.instruction else question

    def text(self, question: str | list[dict]) -> str:
        """The full prompt as a string (what the model sees, special tokens included).

        ``question`` may be a list of chat messages (TRL's conversational format): those are
        rendered with the chat template as they are (the system prompt goes first unless they
        have one; the instruction is not added).
        """
        if not isinstance(question, str):
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError(
                    "the prompt is a list of chat messages but the tokenizer has no chat template: "
                    "give prompts as strings, or use a model whose tokenizer has a chat template"
                )
            messages = list(question)
            if self.system_prompt and not any(m.get("role") == "system" for m in messages):
                messages = [{"role": "system", "content": self.system_prompt}] + messages
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not self.uses_chat_template:
            return self.user_text(question)
        return self.tokenizer.apply_chat_template(self._messages(question), tokenize=False, add_generation_prompt=True)

    def __call__(self, question: str | list[dict]) -> list[int]:
        if isinstance(question, str) and not self.uses_chat_template:
            return self.tokenizer(self.user_text(question), add_special_tokens=True)["input_ids"]
        # The template already holds every special token: tokenize without adding more.
        return self.tokenizer(self.text(question), add_special_tokens=False)["input_ids"]

    def _messages(self, question: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return messages + [{"role": "user", "content": self.user_text(question)}]
