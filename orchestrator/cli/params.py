"""Click parameter types of orch's options. No I/O.

``FiniteFloat``: every float option of orch. Click's ``float`` and ``FloatRange`` accept ``nan``
and ``inf`` (``nan`` passes every range check, since each comparison with it is false): then
``--timeout nan`` waited forever, ``wait_for_nodes`` polled with 0 s sleeps, and ``--kv-cache-gib
nan`` printed "short by nan GiB". A non-finite value is a usage error (exit 2).
"""

from __future__ import annotations

import math
from typing import Any

import click

from orchestrator.plan.engine_terms import GPU_EXTRA_VLLM


class FiniteFloat(click.FloatRange):
    """A ``click.FloatRange`` (bounds optional) that refuses nan and +-inf."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return super().convert(value, param, ctx)  # click's own "is not a valid float"
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


def engine_flags(command):
    """The flags that size vLLM's memory, shared by `orch plan` and `orch rollout` (the rollout
    passes the planned values into engine_kwargs; see PLANNED_ENGINE_ARGS)."""
    options = [
        click.option("--vllm-version", default=None, metavar="X.Y[.Z]", help=(
            "Size for this vLLM version's engine defaults and memory profile [default: the version `orch up` probed "
            f"with --cluster, else {GPU_EXTRA_VLLM}, the version the gpu extra pins]."
        )),  # fmt: skip
        click.option("--max-num-seqs", type=click.IntRange(min=1, max=10_000_000), default=None,
                     help="vLLM max_num_seqs: sequences per step; sizes the sampler warm-up [default: the version's for the GPU]."),
        click.option("--max-num-batched-tokens", type=click.IntRange(min=1, max=10_000_000), default=None,
                     help="vLLM max_num_batched_tokens: tokens per step; sizes the profiled activations [default: the version's for the GPU]."),
        click.option("--enforce-eager", is_flag=True, default=False, help="vLLM enforce_eager: no CUDA graphs (and no CUDA graph memory estimate)."),
        click.option("--block-size", type=click.Choice(["8", "16", "32", "64", "128"]), default=None,
                     help="vLLM block_size: KV tokens per block; the KV cache holds whole blocks [default: vLLM's, 16]."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command
