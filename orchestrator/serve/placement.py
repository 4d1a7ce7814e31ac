"""Where a replica's vLLM workers go: one placement-group bundle per worker, TP inside a node,
pipeline stage *i* pinned to its node through the per-node custom resource that ``orch up``
registered, a data-parallel group's ranks left to Serve's gang placement, and Ray's accelerator
type for the GPUs. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from orchestrator.errors import ServeConfigError

if TYPE_CHECKING:
    from orchestrator.serve.config import ServingPlan

# Fraction of the per-node custom resource each pinned bundle asks for: small enough that any
# number of bundles (and a second copy during a side-by-side rollout) fit in the 1 unit a node has.
NODE_PIN_AMOUNT = 0.001

NODE_PIN_KEY = "<node>"


def ray_accelerator_type(gpu_name: str | None) -> str | None:
    """Ray's accelerator type for a GPU name, as Ray derives it on the node (``H100``, ``A100``, ``L4``).

    Accepts nvidia-smi names ("NVIDIA H100 80GB HBM3") and manifest gpu_type ("H100-80GB").
    Mirrors ray._private.accelerators.nvidia_gpu's name pattern, so the value matches the
    ``accelerator_type:X`` resource Ray registers on real GPU nodes.
    """
    if not gpu_name:
        return None
    name = re.sub(r"^(NVIDIA|Tesla)\s+", "", gpu_name.strip(), flags=re.I)
    name = re.sub(r"^Tesla\s+", "", name, flags=re.I)
    token = re.split(r"[\s\-_]", name, maxsplit=1)[0]
    if re.fullmatch(r"[A-Z]*\d[A-Z0-9]*", token):
        return token
    return None


def stage_nodes_for(plan: ServingPlan, free_gpus: Mapping[str, float]) -> tuple[str, ...] | None:
    """Pick one node per pipeline stage (TP bundles stay inside that node), in the given order.

    Returns None when there is nothing to pin (PP 1: STRICT_PACK keeps TP inside one node) or when
    replicas > 1 (one placement-group layout serves every replica, so pins would stack them on
    the same nodes). Raises ServeConfigError when fewer nodes than stages have tp free GPUs.
    """
    if plan.pp <= 1 or plan.replicas > 1:
        return None
    fitting = [node for node, free in free_gpus.items() if free >= plan.tp]
    if len(fitting) < plan.pp:
        have = ", ".join(f"{n}: {g:g}" for n, g in free_gpus.items()) or "none"
        raise ServeConfigError(
            f"pipeline parallel {plan.pp} x tensor parallel {plan.tp} needs {plan.pp} nodes with "
            f"{plan.tp} free GPUs each; free GPUs per node: {have}",
            hint="free GPUs (orch rollback, or stop other applications) or plan fewer stages",
        )
    return tuple(fitting[: plan.pp])


def rank_bundles(plan: ServingPlan, accelerator: str, cpus_per_cpu_worker: float = 1) -> tuple[list[dict], str]:
    """(bundles, strategy) of one data-parallel rank: its TP workers' bundles.

    Serve gang-schedules a DP group: one placement group of dp x these bundles with the gang's
    PACK (Ray 2.60 deployment_scheduler.py), which fills a node before the next, so ranks spread
    over the nodes as the plan counted them (GPUs per node / TP ranks each). DPServer drops a
    per-replica strategy (with a warning); PACK says what happens. DPServer then hands each rank
    its bundles sorted by node, keeping a rank's TP workers together (data_parallel/dp_server.py)."""
    unit = {"CPU": cpus_per_cpu_worker} if accelerator == "cpu" else {"GPU": 1}
    return [dict(unit) for _ in range(plan.workers)], "PACK"


def replica_placement(
    plan: ServingPlan,
    accelerator: str,
    stage_nodes: Sequence[str] | None,
    node_resource: Callable[[str], str],
    cpus_per_cpu_worker: float = 1,
) -> tuple[list[dict], str]:
    """(bundles, strategy) of a tensor x pipeline parallel replica: one bundle per vLLM worker,
    in rank order (stage 0 first)."""
    if accelerator == "cpu":
        # Serve LLM forces vLLM's mp executor on CPU: the whole replica lives on one node.
        return [{"CPU": cpus_per_cpu_worker} for _ in range(plan.workers)], "STRICT_PACK"
    if plan.pp <= 1:
        # TP inside a node: STRICT_PACK. An explicit TP larger than a node (planner warning):
        # PACK fills a node before it spills onto the next, so the group spans as few as it can.
        return [{"GPU": 1} for _ in range(plan.tp)], "PACK" if plan.tp_spans_nodes else "STRICT_PACK"
    if not stage_nodes:
        # Replicas > 1: no per-replica pins exist; PACK fills one node before the next.
        return [{"GPU": 1} for _ in range(plan.workers)], "PACK"
    bundles = [{"GPU": 1, node_resource(node): NODE_PIN_AMOUNT} for node in stage_nodes for _ in range(plan.tp)]
    return bundles, "PACK"
