"""What `orch rollout` and `orch rollback` report: ``RolloutResult`` (printed, or as JSON). No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from orchestrator.workflows.secrets import for_display


@dataclass
class RolloutResult:
    action: str
    decision: dict
    cluster: str
    revision: int | None = None
    previous_revision: int | None = None
    app_name: str | None = None
    endpoint: str | None = None
    model: str | None = None
    cold_load_s: float | None = None
    first_token_s: float | None = None
    config: dict = field(default_factory=dict)
    plan: dict = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)  # what an interrupted rollout left, and what was done
    calibration: dict | None = None  # what the engines logged against the plan (workflows.calibration)
    calibration_note: str | None = None  # recorded, or why not
    slo_gate: dict | None = None  # --slo-gate: the load the candidate got, what it measured, the verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "decision": self.decision,
            "cluster": self.cluster,
            "revision": self.revision,
            "previous_revision": self.previous_revision,
            "app_name": self.app_name,
            "endpoint": self.endpoint,
            "model": self.model,
            "cold_load_s": self.cold_load_s,
            "first_token_s": self.first_token_s,
            "steps": self.steps,
            "repaired": self.repaired,
            "calibration": self.calibration,
            "calibration_note": self.calibration_note,
            "slo_gate": self.slo_gate,
            "plan": self.plan,
            "config": for_display(self.config),
        }
