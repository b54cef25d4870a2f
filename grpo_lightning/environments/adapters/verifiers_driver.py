"""Plays a verifiers 0.4 environment for the trainer; run with the verifiers venv's Python, never imported.

    python verifiers_driver.py URL TOKENIZER TASKSET_ID [--path DIR] [--harness null] [--max-tokens N]

``SingleAgentEnv`` over the taskset, its agent a verifiers harness (``null``: the plain chat
program) in a subprocess runtime, its model ``TrainClientConfig`` at ``URL`` (our
``GenerateServer``: the client renders to ids and posts to the token-in endpoint). Reads one JSON
object per line on stdin, ``{"tasks": [index, ...], "temperature": t}``; answers one line: a list
with each episode's trace records (``Trace.to_record``). The harness runs as a uv script: ``uv``
must be on PATH (``pip install uv`` into the verifiers venv), and its first run installs the
script's packages from PyPI.
"""

import argparse
import asyncio
import json
import os
import sys


async def serve(args: argparse.Namespace) -> None:
    import verifiers.v1 as vf  # noqa: PLC0415  (the verifiers venv only)
    from verifiers.v1.clients.client import ModelContext  # noqa: PLC0415  (the verifiers venv only)
    from verifiers.v1.runtimes import SubprocessConfig  # noqa: PLC0415  (the verifiers venv only)
    from verifiers.v1.types import SamplingConfig  # noqa: PLC0415  (the verifiers venv only)
    from verifiers.v1.utils.loaders import harness_config_type, taskset_config_type  # noqa: PLC0415  (the verifiers venv only)

    taskset_config = taskset_config_type(args.taskset)(id=args.taskset)
    harness_config = harness_config_type(args.harness)(id=args.harness)
    agent = vf.AgentConfig(harness=harness_config, runtime=SubprocessConfig())
    env = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=taskset_config, agent=agent))
    client = vf.TrainClientConfig(
        base_url=f"{args.url}/v1", api_key_var="VF_UNUSED_KEY", renderer_model_name=args.tokenizer
    )
    tasks = env.taskset.load()
    await env.start()
    try:
        for line in sys.stdin:
            request = json.loads(line)
            sampling = SamplingConfig(max_tokens=args.max_tokens, temperature=request.get("temperature", 1.0))
            ctx = ModelContext(model="policy", client=client, sampling=sampling)
            episodes = await asyncio.gather(*(env.run_episode(tasks[i % len(tasks)], ctx) for i in request["tasks"]))
            records = [[trace.to_record(float_decimals=None) for trace in e.traces] for e in episodes]
            print(json.dumps(records), flush=True)
    finally:
        await env.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("tokenizer", help="the tokenizer folder the client renders with")
    parser.add_argument("taskset", help="a verifiers taskset id (an importable module exporting a Taskset)")
    parser.add_argument("--path", action="append", default=[], help="a folder to import tasksets from")
    parser.add_argument("--harness", default="null")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))  # its verifiers.py would shadow the package
    sys.path[:] = args.path + [p for p in sys.path if os.path.abspath(p or ".") != here]
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
