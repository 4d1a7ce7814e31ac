"""How many requests one Serve replica of an LLM application takes at once. Pure.

Serve's ``max_ongoing_requests`` caps the requests a replica has in flight; the rest wait in
Serve (HAProxy, the request router). vLLM batches up to ``max_num_seqs`` sequences per engine
and queues the rest itself, so a cap below ``max_num_seqs`` keeps the engine's batch from ever
filling: orch's default is the engine's batch with headroom. Ray Serve LLM 2.60's own default is
unlimited (``RAY_SERVE_LLM_DEFAULT_MAX_ONGOING_REQUESTS`` = 1e9 in
``ray/llm/_internal/serve/constants.py``; vLLM's scheduler does all the queueing).

- The batch per Serve replica: ``max_num_seqs`` (the plan's, i.e. ``--max-num-seqs`` or the vLLM
  version's default from ``plan.engine_terms``) times the data-parallel ranks that replica's
  engine holds. With ``build_openai_app`` one LLMServer fronts all of vLLM's DP ranks
  (``data_parallel_size`` in its engine_kwargs); with ``build_dp_openai_app`` each rank is a
  Serve replica of its own (``DPServer``), so that replica's batch is one rank's.
- Headroom (x1.25): a few requests wait inside vLLM, so a finished sequence's slot is filled on
  the engine's next step rather than after a round trip through Serve; and Ray's autoscaling
  guide (docs/serve/advanced-guides/advanced-autoscaling) asks for ``max_ongoing_requests``
  ~20-50% above ``target_ongoing_requests``, which orch sets to the batch (``autoscaling_target``).
- ``--max-ongoing-requests`` (orch rollout) and the manifest's ``serve.max_ongoing_requests``
  replace the default; both are per Serve replica, as Serve means it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HEADROOM = 1.25
# The plan always says max_num_seqs; a plan built without it (a hand-made ServingPlan) gets the
# smallest default of vLLM's V1 API server on a GPU (engine_terms.EngineTerms.batch_defaults).
FALLBACK_MAX_NUM_SEQS = 256

SOURCE_ENGINE = "engine"
SOURCE_FLAG = "--max-ongoing-requests"
SOURCE_MANIFEST = "serve.max_ongoing_requests"


@dataclass(frozen=True)
class InFlight:
    """Serve's ``max_ongoing_requests`` for one replica of the engine deployment, and why."""

    max_ongoing_requests: int
    max_num_seqs: int  # per engine (per DP rank)
    ranks_per_serve_replica: int = 1  # DP ranks one Serve replica's engine holds
    dp: int = 1  # DP ranks of one orch replica (a DP group)
    source: str = SOURCE_ENGINE  # SOURCE_ENGINE, SOURCE_FLAG or SOURCE_MANIFEST

    @property
    def batch(self) -> int:
        """Sequences the engine behind one Serve replica batches at once."""
        return self.max_num_seqs * self.ranks_per_serve_replica

    @property
    def per_group(self) -> int:
        """Requests in flight over one orch replica (all its DP ranks)."""
        return self.max_ongoing_requests * max(1, self.dp // self.ranks_per_serve_replica)

    @property
    def autoscaling_target(self) -> int:
        """Serve's ``target_ongoing_requests``: the batch for orch's default (a replica whose batch
        is full on average calls for another), else 80% of the cap. A whole number, and below the
        cap when the cap allows (a target at the cap never scales up: Ray's autoscaling guide)."""
        target = math.floor(self.max_ongoing_requests / HEADROOM)
        if self.max_ongoing_requests > 1:
            target = min(target, self.max_ongoing_requests - 1)
        return max(1, target)

    def describe(self) -> str:
        """One line for `orch plan` and `orch rollout --dry-run`."""
        ranks = f" x {self.ranks_per_serve_replica} DP ranks" if self.ranks_per_serve_replica > 1 else ""
        if self.source == SOURCE_ENGINE:
            why = f"max_num_seqs {self.max_num_seqs}{ranks} x {HEADROOM:g} headroom"
        else:
            why = f"set by {self.source}; the engine batches {self.batch}"
        group = f", {self.per_group} per DP group of {self.dp} ranks" if self.dp > self.ranks_per_serve_replica else ""
        return f"{self.max_ongoing_requests} per Serve replica ({why}){group}"

    @classmethod
    def from_json(cls, data: dict) -> InFlight:
        """Read back ``to_json`` (a rollout result's plan, a revision's stored plan)."""
        return cls(int(data["max_ongoing_requests"]), int(data["max_num_seqs"]), int(data.get("ranks_per_serve_replica", 1)),
                   int(data.get("dp", 1)), str(data.get("source", SOURCE_ENGINE)))  # fmt: skip

    def to_json(self) -> dict:
        return {
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_num_seqs": self.max_num_seqs,
            "ranks_per_serve_replica": self.ranks_per_serve_replica,
            "dp": self.dp,
            "per_group": self.per_group,
            "target_ongoing_requests": self.autoscaling_target,
            "source": self.source,
        }


def in_flight(
    max_num_seqs: int | None,
    *,
    dp: int = 1,
    ranks_per_serve_replica: int = 1,
    override: int | None = None,
    override_source: str = SOURCE_FLAG,
) -> InFlight:
    """The cap for one Serve replica: ``override`` when given, else the engine's batch
    (``max_num_seqs`` x ``ranks_per_serve_replica``) with ``HEADROOM``."""
    seqs = int(max_num_seqs or FALLBACK_MAX_NUM_SEQS)
    ranks = max(1, int(ranks_per_serve_replica))
    if override:
        return InFlight(int(override), seqs, ranks, max(1, int(dp)), override_source)
    return InFlight(math.ceil(seqs * ranks * HEADROOM), seqs, ranks, max(1, int(dp)), SOURCE_ENGINE)
