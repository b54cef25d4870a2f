"""Chat templates of real model families, written by hand from their published Jinja (tokenizer_config.json
of Qwen2.5-Instruct, Qwen3, Llama-3.1/3.2-Instruct, SmolLM2-Instruct), plus toy templates with one quirk
each, and a character tokenizer that knows every family's special tokens."""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

QWEN_TOOLS_INTRO = (
    "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>"
)
QWEN_TOOLS_OUTRO = (
    "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    "<args-json-object>}\\n</tool_call><|im_end|>\\n"
)

QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    '{{- "\\n\\n' + QWEN_TOOLS_INTRO + '" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "' + QWEN_TOOLS_OUTRO + '" }}'
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first) '
    'or (message.role == "assistant" and not message.tool_calls) %}'
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    '{%- elif message.role == "tool" %}'
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen3: earlier assistant turns lose their <think> block once a new user query follows them, and the
# last assistant turn gets an (empty) <think></think> block when rendered whole.
QWEN3 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    '{{- "' + QWEN_TOOLS_INTRO + '" }}'
    '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}'
    '{{- "' + QWEN_TOOLS_OUTRO + '" }}'
    "{%- else %}{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    '{%- if ns.multi_step_tool and message.role == "user" and message.content is string and '
    "not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}"
    '{%- if (message.role == "user") or (message.role == "system" and not loop.first) %}'
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == \"assistant\" %}{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}"
    "{%- else %}{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for tool_call in message.tool_calls %}"
    "{%- if (loop.first and content) or (not loop.first) %}{{- '\\n' }}{%- endif %}"
    "{%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    '{%- elif message.role == "tool" %}'
    "{%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# Llama 3.1 / 3.2: tools go into the first user message; every content is trimmed; a tool's string
# output is iterable, so it is rendered through tojson (quoted).
LLAMA3 = (
    "{{- bos_token }}"
    "{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}"
    "{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}"
    '{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}'
    "{%- if not tools is defined %}{%- set tools = none %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content']|trim %}"
    '{%- set messages = messages[1:] %}{%- else %}{%- set system_message = "" %}{%- endif %}'
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}'
    '{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}{{- "Today Date: " + date_string + "\\n\\n" }}'
    '{{- system_message }}{{- "<|eot_id|>" }}'
    "{%- if tools_in_user_message and not tools is none %}"
    "{%- if messages | length != 0 %}{%- set first_user_message = messages[0]['content']|trim %}"
    "{%- set messages = messages[1:] %}"
    '{%- else %}{{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}{%- endif %}'
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}"
    '{{- "Given the following functions, please respond with a JSON for a function call " }}'
    '{{- "with its proper arguments that best answers the given prompt.\\n\\n" }}'
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}'
    '{{- "Do not use variables.\\n\\n" }}'
    '{%- for t in tools %}{{- t | tojson(indent=4) }}{{- "\\n\\n" }}{%- endfor %}'
    '{{- first_user_message + "<|eot_id|>"}}{%- endif %}'
    "{%- for message in messages %}"
    "{%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}"
    "{%- elif 'tool_calls' in message %}"
    '{%- if not message.tool_calls|length == 1 %}{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}'
    "{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    '{{- \'{"name": "\' + tool_call.name + \'", \' }}{{- \'"parameters": \' }}{{- tool_call.arguments | tojson }}{{- "}" }}'
    '{{- "<|eot_id|>" }}'
    '{%- elif message.role == "tool" or message.role == "ipython" %}'
    '{{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}'
    "{%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}"
    "{%- else %}{{- message.content }}{%- endif %}"
    '{{- "<|eot_id|>" }}{%- endif %}{%- endfor %}'
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# SmolLM2-Instruct: plain ChatML with a default system prompt; tools= is silently ignored.
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Toy quirks. Boundary: the turn close starts with a newline the model never samples before its stop token.
TOY_BOUNDARY = (
    "{% if tools %}{% for t in tools %}[tool {{ t.function.name }}]{% endfor %}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}\n<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Not prefix-preserving: the first line counts the messages, so every new turn rewrites the start.
TOY_COUNTING = (
    "<|im_start|>system\n{{ messages|length }} messages<|im_end|>\n"
    "{% if tools %}{% for t in tools %}[tool {{ t.function.name }}]{% endfor %}{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

FAMILIES = {"qwen2.5": QWEN25, "qwen3": QWEN3, "llama3": LLAMA3, "smollm2": SMOLLM2}
TOYS = {"boundary_newline": TOY_BOUNDARY, "counting": TOY_COUNTING}

SPECIALS = ["<pad>", "<s>", "<|im_end|>", "<|im_start|>", "<|begin_of_text|>", "<|eot_id|>", "<|eom_id|>"]
SPECIALS += ["<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>"]


def family_tokenizer(template: str, eos: str = "<|im_end|>", bos: str = "<s>") -> PreTrainedTokenizerFast:
    """One token per printable character, every family's markers as special tokens, ``template`` as its chat template."""
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for char in string.printable:
        vocab.setdefault(char, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token=bos, eos_token=eos, unk_token="<pad>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in SPECIALS if t not in (eos, bos, "<pad>")]})
    tokenizer.chat_template = template
    return tokenizer


def tokenizer_for(name: str) -> PreTrainedTokenizerFast:
    if name == "llama3":
        return family_tokenizer(LLAMA3, eos="<|eot_id|>", bos="<|begin_of_text|>")
    return family_tokenizer({**FAMILIES, **TOYS}[name])
