"""``rollout.pipeline.*``: pipelined rollouts (``rollout.mode=pipeline``), docs/pipeline.md."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_lightning.config.base import Schema, check, option


@dataclass
class PipelineConfig(Schema):
    max_lag: int = option(
        1, "pipeline: optimizer steps the producer may run ahead: (max_lag + 1) x prompts_per_step groups in flight."
    )
    max_in_flight: int = option(
        0, "pipeline: most groups generating at once (also below max_lag's bound); 0: no limit but max_lag's."
    )

    def check_fields(self, p: str) -> list[str]:
        problems: list[str] = []
        check(problems, self.max_lag >= 0, f"{p}max_lag={self.max_lag} must be >= 0 (0: no step runs ahead)")
        check(problems, self.max_in_flight >= 0, f"{p}max_in_flight={self.max_in_flight} must be >= 0 (0: no limit)")
        return problems

    def groups_ahead(self, prompts_per_step: int) -> int:
        """Groups generating or finished and not trained yet, at most (AReaL's capacity, ``(max_lag + 1) x P``)."""
        return (self.max_lag + 1) * prompts_per_step
