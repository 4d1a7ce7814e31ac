"""The rollout workflow's world over fakes, shared by the rollout tests: a scripted Serve API
(optionally kept in a file, so a forked and SIGKILLed orch leaves its Serve state behind), an
endpoint that answers only where Serve runs a RUNNING application, fake runners, a real
StateStore in a temp dir and an injected clock (no real sleeping)."""

from __future__ import annotations

import copy
import json
from contextlib import contextmanager
from pathlib import Path

from orchestrator.cluster.node_state import NodeState
from orchestrator.manifest.load import load_manifest
from orchestrator.remote.fake import FakeRunner, Prefix, result
from orchestrator.serve.desired import RolloutRequest
from orchestrator.serve.front import FRONT_DEPLOYMENT, is_front
from orchestrator.serve.ray_io.client import AppStatus, DeploymentStatus, ReplicaStatus, ServeStatus
from orchestrator.serve.ray_io.readiness import ProbeResult
from orchestrator.serve.shapes import llm_config_of, shape_of_app
from orchestrator.state import StateStore
from orchestrator.workflows.desired import desired_for_model
from orchestrator.workflows.rollout import ClusterApis, RolloutOptions, ServingDeps, execute

KEY = "key-for-tests-0123456789"
MANIFEST = """
name: wf
accelerator: cpu
nodes:
  - {name: head, host: 10.0.0.1, role: head, gpus: 0, cpus: 8}
  - {name: w1, host: 10.0.0.2, gpus: 0, cpus: 8}
serve: {http_port: 8000, api_key_env: WF_KEY}
ray: {temp_dir: /tmp/ray-wf}
"""
TRACEBACK = (
    "The deployment failed to start 3 times in a row.\nTraceback (most recent call last):\n"
    '  File "vllm_engine.py", line 222, in _get_vllm_engine_config\n'
    "RuntimeError: Failed to create vLLM engine config: max_num_batched_tokens (1) is smaller than max_model_len"
)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


class FakeServe:
    """Serve's declarative API: apply() records the body; each new app goes through `script`
    (a list of statuses per poll, the last one repeating)."""

    def __init__(self, scripts=None, message="", keep_in: Path | None = None, messages=None):
        self.bodies = []
        self.apps: dict[str, dict] = {}
        self.polls: dict[str, int] = {}
        self.scripts = scripts or {}
        self.message = message
        # name -> the deployment's message at each poll (the last repeating), whatever the status:
        # Serve's "A replica failed to start ... Retrying N more time(s)" while it is DEPLOYING
        self.messages: dict[str, list[str]] = messages or {}
        self.deployed: dict[str, float] = {}
        self.keep_in = keep_in  # a file that holds Serve's state after every call

    def _keep(self):
        if self.keep_in is not None:
            data = {"apps": self.apps, "polls": self.polls, "deployed": self.deployed, "scripts": self.scripts, "message": self.message,
                    "messages": self.messages}  # fmt: skip
            self.keep_in.write_text(json.dumps(data))

    @classmethod
    def load(cls, path: Path) -> FakeServe:
        """The Serve a (killed) process left behind in ``path``: what a new orch finds."""
        data = json.loads(path.read_text())
        serve = cls(scripts=data["scripts"], message=data["message"], keep_in=path, messages=data.get("messages"))
        serve.apps, serve.polls, serve.deployed = data["apps"], data["polls"], data["deployed"]
        return serve

    def last_seen(self, name):
        """The status orch's last poll got for ``name`` (None: never polled since it deployed)."""
        script = self.scripts.get(name, ["DEPLOYING", "RUNNING"])
        polls = self.polls.get(name, 0)
        return script[min(polls - 1, len(script) - 1)] if name in self.apps and polls > 0 else None

    def state_of(self, name):
        """The status Serve reports for ``name`` now, without counting a poll."""
        script = self.scripts.get(name, ["DEPLOYING", "RUNNING"])
        return script[min(self.polls.get(name, 0), len(script) - 1)] if name in self.apps else None

    def apply(self, body):
        """Like Serve: a new application, or a changed config of an existing one, deploys again
        (its script restarts and its last_deployed_time_s moves on); an unchanged one stays."""
        self.bodies.append(copy.deepcopy(body))
        names = {a["name"] for a in body["applications"]}
        self.apps = {n: a for n, a in self.apps.items() if n in names}
        for app in body["applications"]:
            if self.apps.get(app["name"]) != app:
                self.polls[app["name"]] = 0
                self.deployed[app["name"]] = self.deployed.get(app["name"], 0.0) + 1.0
            self.apps[app["name"]] = copy.deepcopy(app)
        self._keep()

    def status(self):
        out = {}
        for name, cfg in self.apps.items():
            script = self.scripts.get(name, ["DEPLOYING", "RUNNING"])
            i = self.polls.get(name, 0)
            self.polls[name] = i + 1
            st = script[min(i, len(script) - 1)]
            dep_status = {"RUNNING": "HEALTHY", "DEPLOY_FAILED": "DEPLOY_FAILED"}.get(st, "UPDATING")
            if is_front(cfg):  # orch's front: one replica of its own deployment
                rep = ReplicaStatus("f1", "RUNNING" if st == "RUNNING" else "STARTING", node_id="n-head")
                out[name] = AppStatus(name, st, route_prefix=cfg["route_prefix"], last_deployed_time_s=self.deployed[name],
                                      deployments=(DeploymentStatus(FRONT_DEPLOYMENT, dep_status, replicas=(rep,)),),
                                      deployed_config=cfg)  # fmt: skip
                continue
            # A data-parallel application's engine deployment is DPServer:<model>, one replica per rank.
            shape = shape_of_app(cfg)
            ranks = (llm_config_of(cfg).get("engine_kwargs") or {}).get("data_parallel_size", 1) if shape.gang else 1
            reps = tuple(ReplicaStatus(f"r{k + 1}", "RUNNING" if st == "RUNNING" else "STARTING", node_id="n-head",
                                       log_file_path=f"/serve/replica_{name}{f'_{k}' if k else ''}.log") for k in range(ranks))  # fmt: skip
            message = self.message if st == "DEPLOY_FAILED" else ""
            if self.messages.get(name):
                message = self.messages[name][min(i, len(self.messages[name]) - 1)]
            model_id = (llm_config_of(cfg).get("model_loading_config") or {}).get("model_id", "tiny")
            dep = DeploymentStatus(f"{shape.engine_class}:{model_id}", dep_status, message=message, replicas=reps)
            out[name] = AppStatus(name, st, route_prefix=cfg["route_prefix"], last_deployed_time_s=self.deployed[name],
                                  deployments=(dep,), deployed_config=cfg)  # fmt: skip
        self._keep()
        return ServeStatus(applications=out, http_port=8000)


class FakeEndpoint:
    def __init__(self, ok=True, unauth=401):
        self.ok, self.unauth, self.probes = ok, unauth, []

    def probe(self, route, model, key):
        self.probes.append((route, model, key))
        if self.ok:
            return ProbeResult(True, url="http://10.0.0.1:8000" + route, first_token_s=0.05, output_tokens=8)
        return ProbeResult(False, url="http://10.0.0.1:8000" + route, status_code=500, error="http: HTTP 500")

    def unauthenticated_status(self, route, model):
        return self.unauth


class ServeEndpoint(FakeEndpoint):
    """The public endpoint as Serve's state makes it: a completion on a route answers only when
    an application on that route has been seen RUNNING by orch's last status poll."""

    def __init__(self, world):
        super().__init__()
        self.world = world

    def probe(self, route, model, key):
        """The completion's path is ROUTE/v1/completions: the application with the longest route
        prefix of it takes it (Serve's HAProxy: ray/serve/_private/haproxy.py)."""
        serve = self.world.serve
        path = route.rstrip("/") + "/v1/completions"
        routes = [(cfg["route_prefix"], name) for name, cfg in serve.apps.items()
                  if path == cfg["route_prefix"] or path.startswith(cfg["route_prefix"].rstrip("/") + "/")]  # fmt: skip
        taker = max(routes, key=lambda r: len(r[0]))[1] if routes else None
        self.ok = taker is not None and serve.last_seen(taker) == "RUNNING"
        self.taken_by = getattr(self, "taken_by", []) + [taker]
        return super().probe(route, model, key)


def fail_the_update(world, put: int = 2, app: str = "orch") -> None:
    """Script ``world``'s Serve: the ``put``-th apply (an update of the live ``app``: in place, or
    a change of its replica count) leaves it DEPLOY_FAILED with the replica's traceback; every
    other (the restore) brings it up."""
    real_apply = world.serve.apply

    def apply(body):
        real_apply(body)
        world.serve.scripts[app] = ["DEPLOY_FAILED"] if len(world.serve.bodies) == put else ["DEPLOYING", "RUNNING"]

    world.serve.apply = apply
    world.serve.message = TRACEBACK


def fail_the_switch(world, switch: int, restore: list[str], app: str = "orch") -> None:
    """Script ``world``'s Serve: the ``switch``-th apply (the live application taking the new
    config) leaves ``app`` DEPLOY_FAILED with the replica's traceback, the next one (the restore)
    gives ``restore``."""
    real_apply = world.serve.apply

    def apply(body):
        real_apply(body)
        if len(world.serve.bodies) == switch:
            world.serve.scripts[app] = ["DEPLOYING", "DEPLOY_FAILED"]
        elif len(world.serve.bodies) == switch + 1:
            world.serve.scripts[app] = restore

    world.serve.apply = apply
    world.serve.message = TRACEBACK


def _nodes(cpus_used=0.0):
    return [
        NodeState("n-head", "head", "10.0.0.1", "ALIVE", True, {"CPU": 8.0}, {"CPU": cpus_used}),
        NodeState("n-w1", "w1", "10.0.0.2", "ALIVE", False, {"CPU": 8.0}, {"CPU": cpus_used}),
    ]


def make_world(tmp_path, manifest_text=MANIFEST):
    manifest = load_manifest(manifest_text, tmp_path / "cluster.yaml")
    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16", "head_dim": 64}))  # fmt: skip
    state = StateStore(tmp_path / "state", clock=lambda: 1000.0)
    state.record_cluster("wf", manifest.fingerprint(), "10.0.0.1", 8265, {"head": "n-head", "w1": "n-w1"})

    class World:
        pass

    w = World()
    w.manifest, w.model, w.state, w.clock = manifest, model, state, Clock()
    w.serve, w.endpoint, w.nodes = FakeServe(), FakeEndpoint(), _nodes()
    w.runners = {
        "head": FakeRunner("head", default=result()).on(Prefix("tail"), result(stdout="INFO start\nValueError: from the log\n"))
        .on(("nproc",), result(stdout="8\n")).on(("printenv", "HOME"), result(stdout="/home/ops\n")),
        "w1": FakeRunner("w1", default=result()).on(("nproc",), result(stdout="4\n")).on(("printenv", "HOME"), result(stdout="/home/ops\n")),
    }
    w.validated = []

    @contextmanager
    def open_runners(_m):
        yield w.runners

    @contextmanager
    def open_apis(_m, _r, _t):
        yield ClusterApis(serve=w.serve, nodes=lambda: w.nodes, endpoint=w.endpoint)

    w.deps = ServingDeps(state=state, open_runners=open_runners, open_apis=open_apis, validate=w.validated.append,
                         clock=w.clock, sleep=w.clock.sleep, environ={})  # fmt: skip

    def rollout(key=KEY, options=RolloutOptions(timeout_s=60, probe_timeout_s=10), **req):
        fields = {"model": str(model), "served_name": "tiny", "replicas": 1, "max_model_len": 1024, **req}
        return execute(manifest, desired_for_model(manifest, RolloutRequest(**fields), serving=w.deps.state), key, w.deps, options)

    w.rollout = rollout
    return w


