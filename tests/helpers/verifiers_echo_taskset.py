"""A verifiers 0.4 (``verifiers.v1``) taskset for the adapter's tests, imported by verifiers as the
taskset ``verifiers_echo_taskset`` (run from the verifiers venv): each task asks for a reply (in the
tiny model's alphabet), and the reward is the reply's length in characters over 10, capped at 1,
so different samples score differently."""

import verifiers.v1 as vf


class EchoData(vf.TaskData):
    pass


class EchoTask(vf.Task[EchoData]):
    @vf.reward(weight=1.0)
    async def length(self, trace: vf.Trace) -> float:
        return min(len(trace.last_reply or "") / 10, 1.0)


class EchoConfig(vf.TasksetConfig):
    num_tasks: int = 4


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self) -> list[EchoTask]:
        return [EchoTask(EchoData(prompt=f"{i}+{i}=?"), self.config.task) for i in range(self.config.num_tasks)]


__all__ = ["EchoTaskset"]
