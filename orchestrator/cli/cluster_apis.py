"""The real cluster APIs a rollout runs against: Serve REST and the dashboard's node and actor
lists through one SSH tunnel to the head's 127.0.0.1 (directly for a local head), and the public
endpoint at the head's address and the manifest's Serve port. I/O; the adapters behind
``workflows.rollout_steps.ClusterApis``, wired by ``cli.wiring.serving_deps``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from orchestrator.cluster.dashboard import open_dashboard
from orchestrator.manifest.model import Manifest
from orchestrator.remote.runner import Runner
from orchestrator.serve.ray_io import readiness
from orchestrator.serve.ray_io.client import open_serve_client
from orchestrator.status.workers import ACTORS_PARAMS, ACTORS_PATH, parse_actors
from orchestrator.workflows.rollout_steps import ClusterApis


class HttpEndpoint:
    """readiness.* bound to the public base URL."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def probe(self, route_prefix: str, model: str, api_key: str | None):
        return readiness.probe_completion(self.base_url, route_prefix, model, api_key)

    def unauthenticated_status(self, route_prefix: str, model: str) -> int | None:
        return readiness.unauthenticated_status(self.base_url, route_prefix, model)

    def load(self, route_prefix: str, model: str, api_key: str, gate) -> dict:
        """The SLO gate's load through ``route_prefix`` with orch's load generator (`orch bench`'s
        run: prompts sized from the server's own token counts, the recorded shape), ended as soon
        as the objective can no longer be met (``slo_gate.decided_miss``)."""
        from orchestrator.bench.session import BenchOptions, run_bench
        from orchestrator.serve.slo_gate import decided_miss

        shape = gate.shape
        opts = BenchOptions(
            base_url=self.base_url.rstrip("/") + route_prefix.rstrip("/"), model=model, concurrency=(gate.concurrency,),
            requests=gate.requests, prompt_tokens=int(shape.get("prompt_tokens") or 128), output_tokens=int(shape.get("output_tokens") or 64),
            endpoint=str(shape.get("endpoint") or "completions"), api_key=api_key, warmup=1,
            workload=str(shape.get("workload") or "random"), prefixes=int(shape.get("prefixes") or 8),
            prefix_tokens=int(shape.get("prefix_tokens") or 1024),
        )  # fmt: skip
        result, _runs = run_bench(opts, stop=lambda records: decided_miss(gate, records) is not None)
        return result


@contextmanager
def open_cluster_apis(manifest: Manifest, runners: Mapping[str, Runner], token: str | None) -> Iterator[ClusterApis]:

    head = runners[manifest.head.name]
    with open_dashboard(head, manifest.ray.dashboard_port, token) as dash, open_serve_client(head, manifest.ray.dashboard_port, token) as serve:
        yield ClusterApis(serve=serve, nodes=dash.nodes_with_usage, endpoint=HttpEndpoint(manifest.serve_url()),
                          actors=lambda: parse_actors(dash.get_json(ACTORS_PATH, ACTORS_PARAMS)))  # fmt: skip
