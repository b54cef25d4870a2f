"""Run from the verifiers venv: two turns of a conversation through verifiers' own token-in client
(``renderers.client.generate``, what ``TrainClientConfig`` calls) against a generate server; prints
what the client parsed, as JSON. Usage: python verifiers_generate_client.py URL TOKENIZER_FOLDER"""

import asyncio
import json
import sys

from openai import AsyncOpenAI
from renderers import DefaultRenderer
from renderers.client import generate
from transformers import AutoTokenizer


async def main(url: str, folder: str) -> None:
    renderer = DefaultRenderer(AutoTokenizer.from_pretrained(folder))
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY")
    messages = [{"role": "user", "content": "hi there"}]
    turns = []
    for _ in range(2):
        result = await generate(
            client=client, renderer=renderer, messages=messages, model="policy", sampling_params={"max_tokens": 8}
        )
        keys = ("prompt_ids", "completion_ids", "completion_logprobs", "finish_reason", "content")
        turns.append({key: result[key] for key in keys})
        messages += [{"role": "assistant", "content": result["content"] or ""}, {"role": "user", "content": "more"}]
    print(json.dumps(turns))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
