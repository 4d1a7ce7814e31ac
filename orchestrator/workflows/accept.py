"""``AcceptanceEnv`` wired to a running orch cluster. Does I/O: runners (SSH or local) for the
topology probes and the engine kill, Serve's REST API through the head's dashboard (tunnelled),
the public endpoint (load, probes), the state store (cold-load record of the current revision).

The engine kill is precise: Serve's status names the LLM replica's actor pid and node; orch
kills that actor's child process named ``VLLM::EngineCore`` (vLLM's process title, truncated to
15 characters in ``comm``) with SIGKILL on that node, so nothing else on the machine is touched.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.accept.stages import LoadShape
from orchestrator.bench.loadgen import ClientPool, Prompt, RequestSpec, send_pooled
from orchestrator.bench.prompts import random_words
from orchestrator.bench.session import BenchOptions, run_bench
from orchestrator.cluster.ray_nodes import ray_process_env
from orchestrator.errors import RemoteError, ServeError, StateError
from orchestrator.manifest.model import Manifest
from orchestrator.nodes.inventory import gather_facts
from orchestrator.polling import poll_until
from orchestrator.remote.runner import Runner, fan_out
from orchestrator.runbooks import runbook
from orchestrator.serve.config import deploy_body
from orchestrator.serve.ray_io import readiness
from orchestrator.serve.ray_io.client import APP_RUNNING, AppStatus, ServeClient
from orchestrator.state import Revision, StateStore
from orchestrator.status.serving import model_of_deployment, pick_app
from orchestrator.workflows.served_models import current_of, served_app_name

ENGINE_COMM = "VLLM::EngineCor"  # comm is the first 15 characters of vLLM's "VLLM::EngineCore" title
COLLECTIVE_ENV_PREFIXES = ("NCCL_", "GLOO_", "VLLM_HOST_IP", "CUDA_VISIBLE_DEVICES", "UCX_", "FI_")


def app_health(app: AppStatus | None) -> str:
    """"healthy" when the app is RUNNING and every deployment HEALTHY with all replicas RUNNING;
    otherwise a short description of what is not."""
    if app is None:
        return "absent"
    if app.status != APP_RUNNING:
        return app.status.lower()
    for d in app.deployments:
        states = d.replica_states()
        if d.status != "HEALTHY" or any(s != "RUNNING" for s in states):
            return f"{d.name} {d.status.lower()} " + ",".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
    return "healthy"


def engine_replica(app: AppStatus, model: str | None) -> tuple[Any, Any]:
    """The (deployment, replica) serving ``model`` (its LLMServer deployment), RUNNING first."""
    deps = [d for d in app.deployments if model_of_deployment(d.name) is not None]
    if model is not None:
        deps = [d for d in deps if model_of_deployment(d.name) == model] or deps
    for d in deps:
        reps = sorted(d.replicas, key=lambda r: r.state != "RUNNING")
        if reps:
            return d, reps[0]
    raise ServeError(f"application {app.name} has no LLMServer replica", hint="orch status shows the application")


def collective_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(COLLECTIVE_ENV_PREFIXES)}


@dataclass
class _Background:
    thread: threading.Thread
    stop_event: threading.Event
    records: list = field(default_factory=list)

    def stop(self) -> dict:
        self.stop_event.set()
        self.thread.join(timeout=120)
        failed = [r for r in self.records if not r.ok]
        errors: dict[str, int] = {}
        for r in failed:
            errors[r.error_kind or "unknown"] = errors.get(r.error_kind or "unknown", 0) + 1
        return {"requests": len(self.records), "failed": len(failed), "errors": errors}


class ClusterAcceptanceEnv:
    """The real cluster behind ``orchestrator.accept.stages``."""

    def __init__(
        self,
        manifest: Manifest,
        state: StateStore,
        runners: Mapping[str, Runner],
        serve: ServeClient,
        bench: BenchOptions,
        app_name: str | None = None,
        clock=time.monotonic,
        sleep=time.sleep,
    ) -> None:
        self.manifest = manifest
        self.state = state
        self.runners = runners
        self.serve = serve
        self.bench = bench
        rev = model_revision(state, manifest.name, bench.model)
        # The model's own application (several models: the front holds "/", pick_app would find it).
        self.app_name = app_name or (served_app_name(state, rev) if rev is not None else None)
        self._clock = clock
        self._sleep = sleep

    # -- time
    def clock(self) -> float:
        return self._clock()

    def sleep(self, seconds: float) -> None:
        self._sleep(seconds)

    # -- topology
    def topology(self) -> dict[str, dict]:

        nodes = {n.name: n for n in self.manifest.nodes}

        def probe(r: Runner):
            return gather_facts(r, nodes[r.node], self.manifest)

        out: dict[str, dict] = {}
        for outcome in fan_out(list(self.runners.values()), probe):
            if not outcome.ok:
                out[outcome.node] = {"error": str(outcome.error)}
                continue
            facts = outcome.value
            spec = nodes[outcome.node]
            configured = ray_process_env(self.manifest, spec, facts, token_path="-")
            out[outcome.node] = {
                "host": facts.host,
                "gpus": [{"index": g.index, "name": g.name, "memory_mib": g.memory_total_mib} for g in facts.gpus],
                "links": [list(row) for row in facts.topology.links] if facts.topology else [],
                "nvlink": facts.topology.nvlink if facts.topology else None,
                "nics": [
                    {"name": n.name, "state": n.state, "mtu": n.mtu, "addresses": [a.address for a in n.addresses]}
                    for n in facts.nics
                ],
                "ib": [{"device": p.device, "port": p.port, "state": p.state, "rate_gbps": p.rate_gbps} for p in facts.ib_devices],
                "collective_env": collective_env(configured),
                "versions": facts.versions.to_dict() if facts.versions else None,
                "probe_errors": dict(facts.errors),
            }
        return out

    # -- cold load
    def cold_load(self) -> dict | None:

        rev = model_revision(self.state, self.manifest.name, self.bench.model)
        if rev is None:
            raise StateError(f"cluster {self.manifest.name!r} has no ready revision", hint="orch rollout --model NAME cluster.yaml")
        meta = self.state.revision_meta(self.manifest.name, rev.number) or {}
        seconds = meta.get("cold_load_s")
        if seconds is None and rev.finished_at is not None:
            seconds = rev.finished_at - rev.created_at
        return {"seconds": seconds, "source": f"revision {rev.number} record", "revision": rev.number, "first_token_s": meta.get("first_token_s")}

    # -- load
    def load(self, shape: LoadShape) -> dict:
        opts = replace(self.bench, prompt_tokens=shape.prompt_tokens, output_tokens=shape.output_tokens,
                       concurrency=shape.concurrency, rate=None, requests=shape.requests)  # fmt: skip
        result, _ = run_bench(opts)
        return result

    def start_background_load(self, concurrency: int) -> _Background:
        spec = RequestSpec(base_url=self.bench.base_url, model=self.bench.model, output_tokens=32,
                           api_key=self.bench.api_key, timeout_s=30.0)  # fmt: skip
        stop = threading.Event()
        bg = _Background(threading.Thread(target=lambda: None), stop)

        async def worker(pool: ClientPool, i: int) -> None:
            n, rng = 0, random.Random(i)
            while not stop.is_set():
                rec = await send_pooled(pool, spec, Prompt(f"{i}-{n} " + random_words(rng, 24)), time.perf_counter)
                bg.records.append(rec)
                n += 1
                if not rec.ok:
                    await asyncio.sleep(0.5)  # a dead replica answers at once: do not spin

        async def main() -> None:
            async with ClientPool(spec) as pool:
                await asyncio.gather(*(worker(pool, i) for i in range(concurrency)))

        bg.thread = threading.Thread(target=lambda: asyncio.run(main()), name="orch-accept-load", daemon=True)
        bg.thread.start()
        return bg

    # -- Serve
    def _app(self) -> AppStatus | None:
        status = self.serve.status()
        return pick_app(status, self.app_name)

    def serve_health(self) -> str:
        try:
            return app_health(self._app())
        except ServeError as exc:
            return f"serve api error: {exc.message[:80]}"

    def probe(self) -> bool:
        return readiness.probe_completion(self.bench.base_url, "/", self.bench.model, self.bench.api_key, timeout_s=30.0).ok

    def _runner_for(self, node_id: str | None, node_ip: str | None) -> Runner:
        rec = self.state.get_cluster(self.manifest.name)
        by_id = {v: k for k, v in (rec.node_ids if rec else {}).items()}
        name = by_id.get(node_id or "")
        if name is None:
            name = next((n.name for n in self.manifest.nodes if n.host == node_ip), None)
        if name is None and len(self.runners) == 1:
            name = next(iter(self.runners))
        if name is None or name not in self.runners:
            raise RemoteError(f"cannot tell which node runs the replica (node id {node_id}, ip {node_ip})",
                              hint="orch status lists the nodes; the cluster record may be stale (orch up)")  # fmt: skip
        return self.runners[name]

    def kill_engine(self) -> dict:
        app = self._app()
        if app is None:
            raise ServeError("no Serve application is running", hint="orch rollout --model NAME cluster.yaml")
        dep, rep = engine_replica(app, self.bench.model)
        if rep.pid is None:
            raise ServeError(f"Serve does not report the pid of replica {rep.replica_id}")
        runner = self._runner_for(rep.node_id, rep.node_ip)
        found = runner.run(["pgrep", "-P", str(rep.pid), "-x", ENGINE_COMM], timeout=15.0)
        pids = [int(p) for p in found.stdout.split() if p.strip().isdigit()]
        if not pids:
            raise RemoteError(f"{runner.node}: no {ENGINE_COMM} child of replica pid {rep.pid}",
                              hint=f"the replica may use another executor; see {runbook('acceptance')}", node=runner.node)  # fmt: skip
        runner.run(["kill", "-9", str(pids[0])], timeout=15.0).check(runner.node)
        return {"node": runner.node, "pid": pids[0], "process": "VLLM::EngineCore", "replica": rep.replica_id,
                "replica_pid": rep.pid, "deployment": dep.name}  # fmt: skip

    def redeploy(self) -> None:
        """The same revision again: the application removed, then its deployed config re-applied."""

        status = self.serve.status()
        app = pick_app(status, self.app_name)
        if app is None or not app.deployed_config:
            raise ServeError("no deployed application config to redeploy", hint="orch status")
        others = [a.deployed_config for n, a in status.applications.items() if n != app.name and a.deployed_config]
        self.serve.apply(deploy_body(others, self.manifest))
        poll_until(lambda: app.name in self.serve.status().applications, lambda present: not present,
                   deadline=self._clock() + 300, clock=self._clock, sleep=self._sleep, interval=2.0)  # fmt: skip
        self.serve.apply(deploy_body([*others, app.deployed_config], self.manifest))


def model_revision(state: StateStore, cluster: str, served_name: str | None) -> Revision | None:
    """The ready revision serving ``served_name`` (several models per cluster); when no revision
    records that name (an older record), the newest ready one."""
    return current_of(state, cluster, served_name) or state.current_revision(cluster)


def deployed_max_model_len(state: StateStore, cluster: str, served_name: str | None = None) -> int | None:
    """The max_model_len the model's current revision was planned or rendered with (None: unknown)."""
    rev = model_revision(state, cluster, served_name)
    if rev is None:
        return None
    for source in (rev.plan or {}, rev.config or {}):
        found = _find_key(source, "max_model_len")
        if isinstance(found, int):
            return found
    return None


def _find_key(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            got = _find_key(v, key)
            if got is not None:
                return got
    elif isinstance(obj, list):
        for v in obj:
            got = _find_key(v, key)
            if got is not None:
                return got
    return None
