"""Click parameter types of orch's options. No I/O.

``FiniteFloat``: every float option of orch. Click's ``float`` and ``FloatRange`` accept ``nan``
and ``inf`` (``nan`` passes every range check, since each comparison with it is false): then
``--timeout nan`` waited forever, ``wait_for_nodes`` polled with 0 s sleeps, and ``--kv-cache-gib
nan`` printed "short by nan GiB". A non-finite value is a usage error (exit 2).
"""

from __future__ import annotations

import math
from pathlib import Path
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

    def _describe_range(self) -> str:
        # click writes "x<=None" for a range without bounds (`orch bench --help` showed it)
        if self.min is None and self.max is None:
            return ""
        return super()._describe_range()


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
        click.option("--sampler", type=click.Choice(["flashinfer", "pytorch"]), default=None, help=(
            "The top-k/top-p sampler the engine uses and profiles (rendered as VLLM_USE_FLASHINFER_SAMPLER) "
            "[default: the version's: flashinfer from vLLM 0.29, or where `orch up` found flashinfer installed]."
        )),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def load_target_options(fn):
    """The options `orch bench` and `orch accept` share: where the load goes and what it reports."""
    opts = [
        click.argument("cluster_yaml", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)),
        click.option("--url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000 (default: the cluster's)."),
        click.option("--model", help="Served model name (default: the only one /v1/models lists)."),
        click.option("--api-key-env", help="Environment variable holding the API key (default: the manifest's serve.api_key_env)."),
        click.option("--metrics-url", multiple=True, help="Prometheus page(s) with vLLM's metrics (repeatable; default: discovered)."),
        click.option("--tokenizer", type=click.Path(exists=True, file_okay=False, path_type=Path), help="Local model folder: exact prompt lengths."),
        click.option("--chat", is_flag=True, help="Use /v1/chat/completions instead of /v1/completions."),
        click.option("--seed", type=int, default=None, help="Seed of prompts and arrivals [default: a new one per run, printed in the results; a repeated seed resends the same prompts, which vLLM's prefix cache then answers from cache]."),
        click.option("--timeout", "timeout_s", type=FiniteFloat(min=0, min_open=True), default=300.0, show_default=True, help="Per-request timeout (s)."),
        click.option("--json", "json_mode", is_flag=True, help="Print the results as JSON."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Write results.json, report.md and plots here."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn
