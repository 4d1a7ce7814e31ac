"""A simulated Ray world for tests of the cluster workflows and CLI (FakeRunners + fake dashboard).

``World`` plays the nodes: `ray start` makes a node ALIVE in the fake dashboard (the worker only
if the head runs), `ray stop` removes it, ``kill_raylet`` leaves a DEAD record as Ray does.
``Clock`` is a fake clock whose ``sleep`` only advances it.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from orchestrator.cluster.dashboard import DashboardUnavailable
from orchestrator.cluster.node_state import NodeState
from orchestrator.cluster.ray_nodes import node_resource
from orchestrator.collective.plan import JOB_MARK
from orchestrator.errors import UnreachableError
from orchestrator.manifest.load import load_manifest
from orchestrator.nodes.facts import NicAddress, NicInfo, NodeFacts, Versions
from orchestrator.remote.fake import FakeRunner, result
from orchestrator.remote.node_programs import source

PY = "/opt/venv/bin/python"
YAML = f"""
name: tb
python: {PY}
nodes:
  - {{name: head, host: 10.0.0.1, role: head, gpus: 8, interface: eth1}}
  - {{name: w1, host: 10.0.0.2, gpus: 8, interface: eth1}}
  - {{name: w2, host: 10.0.0.3, gpus: 8, interface: eth1}}
ray: {{port: 26379, dashboard_port: 28265, temp_dir: /tmp/orch-tb}}
"""


# What `ray start --node-ip-address ADDR` reports: loopback names become the machine's own address
# (ray/_private/services.py: resolve_ip_for_localhost -> get_node_ip_address); others stay.
MACHINE_ADDRESS = "192.0.2.44"
# What `ray start` prints when the new raylet did not register in time (ray/_private/node.py, Ray
# 2.60) and when the GCS cannot be reached (ray/_private/state.py): the first is retried longer.
REGISTRATION_TIMEOUT_SAID = (
    "Exception: The current node timed out during startup. This could happen because some of the "
    "raylet failed to startup or the GCS has become overloaded."
)
GCS_UNREACHABLE_SAID = (
    "ray.exceptions.RaySystemError: System error: Failed to connect to GCS. Please check if the GCS "
    "server is running and if this node can connect to the head node."
)


def ray_node_ip(given: str) -> str:
    return MACHINE_ADDRESS if given in ("localhost", "127.0.0.1", "::1") else given


def manifest_of(text: str = YAML):
    return load_manifest(text, Path("/x/tb.yaml"))


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += max(s, 0.01)


class World:
    """The simulated nodes and the head's view of the Ray cluster."""

    def __init__(self, manifest, unreachable=(), never_joins=(), start_fails=(), start_error=REGISTRATION_TIMEOUT_SAID):
        self.manifest = manifest
        self.running: dict[str, NodeState] = {}
        self.dead: list[NodeState] = []
        self.unreachable = set(unreachable)
        self.never_joins = set(never_joins)
        # node -> how many `ray start` calls fail before it works (a set: every call fails)
        self.start_fails = dict(start_fails) if isinstance(start_fails, dict) else {n: 10**6 for n in start_fails}
        self.start_error = start_error  # what a failing `ray start` prints
        self.serial = 0
        self.runners = {n.name: self._runner(n.name) for n in manifest.nodes}
        self.dashboard_opens: list[tuple[str, int, str | None]] = []
        self.dirs: list[tuple[str, ...]] = []  # mkdir/rmdir argv run on any node
        self.leftovers: set[str] = set()  # nodes where Ray processes of the cluster run that no dashboard lists
        self.vllm: set[str] = set()  # nodes with orphaned vLLM engine processes of the cluster
        self.head_up = threading.Event()  # the head's GCS listens
        self.start_barrier: threading.Barrier | None = None
        self.lock = threading.Lock()  # nodes where Ray processes run that no dashboard lists
        self.cluster_id: str | None = None  # ORCH_CLUSTER_ID of the processes started
        self.denied: set[str] = set()  # nodes whose stop script reports a process it may not touch
        self.private_dirs: list[tuple[str, str]] = []  # (node, path) made 0700 before `ray start`
        self.collective_jobs: list[tuple[str, dict, dict]] = []  # (node, spec, env) of each collective job run
        self.collective_broken: dict[str, str] = {}  # node -> the error its job reports at the rendezvous
        # Serve, played: engine replicas as (node, model); a drained node's replicas move to another
        # ALIVE node that is not draining at the next actor read (Serve starts the replacement
        # first), unless the node is in ``stuck``
        self.engines: list[tuple[str, str]] = []
        self.draining: set[str] = set()  # node ids
        self.drains: list[tuple[str, tuple, dict]] = []  # (node run on, argv after the module, env)
        self.stuck: set[str] = set()
        self.used: dict[str, dict[str, float]] = {}  # node -> resources in use (/api/cluster_status)

    def _runner(self, name: str) -> FakeRunner:
        world = self

        def respond(argv, env):
            if name in world.unreachable:
                raise UnreachableError(f"{name}: connection refused", node=name)
            if argv == ("printenv", "HOME"):
                return result("/home/ops\n")
            if argv[:3] == (PY, "-m", "ray.scripts.scripts"):
                return world.ray(name, argv[3:], env)
            if argv[:3] == (PY, "-c", source("stop_ray")):
                return world.stop(name, argv[3:])
            if argv[:3] == (PY, "-c", source("private_dir")):
                world.private_dirs.append((name, argv[3]))
                return result()
            if argv[0] in ("mkdir", "rmdir"):
                world.dirs.append(argv)
                return result()
            if argv[:3] == ("rm", "-f", "--"):
                world.runners[name].files.pop(argv[3], None)
                return result()
            if argv[:3] == ("rm", "-rf", "--"):
                world.dirs.append(argv)
                return result()
            if argv[:3] == (PY, "-c", source("free_port")):
                return result("41234\n")
            if argv[:2] == (PY, "-c") and len(argv) > 3 and argv[3] == JOB_MARK:
                return world.collective_job(name, json.loads(argv[4]), env)
            if argv[:2] == (PY, "-c"):  # the versions probe
                return result(json.dumps({"python": "3.11.2", "ray": "2.60.0", "vllm": "0.32.0", "torch": "2.13.0"}))
            raise AssertionError(f"unexpected {argv}")

        return FakeRunner(name, default=respond)

    def collective_job(self, name, spec, env):
        """What the collective job prints (the report format of orchestrator/remote/node_programs/collective_job.py):
        every group works at ~1 GB/s, except that a node in ``collective_broken`` cannot join."""
        with self.lock:
            self.collective_jobs.append((name, spec, dict(env or {})))
        rank, world = spec["rank"], spec["world"]
        report = {"rank": rank, "world": world, "backend": spec["backend"], "links": {"eth1": 10000}, "stage": "done"}
        if name in self.collective_broken:
            report["error"] = {"stage": "rendezvous", "message": self.collective_broken[name]}
            return result("ORCH-COLLECTIVE-REPORT " + json.dumps(report) + "\n", exit_code=4)
        timed = {"ok": True, "results": [{"bytes": b, "iters": i, "seconds": b / 1e9 + 1e-5}
                                         for b, i in zip(spec["sizes"], spec["iters"])]}  # fmt: skip
        names = [n.name for n in self.manifest.nodes]
        broken = {names.index(n) for n in self.collective_broken if n in names}
        if rank == 0:
            report["pairs"] = {str(w): ({"ok": False, "error": "TimeoutError: did not reach the rendezvous within 20 s"}
                                        if w in broken else timed) for w in range(1, world)}  # fmt: skip
        else:
            report["pair"] = timed
        if not broken and spec.get("alltoall"):  # every pair's all-to-all at the smallest and largest size
            pair = {"ok": True, "results": [timed["results"][0], timed["results"][-1]]}
            report["mesh"] = {str(p): pair for p in range(world) if p != rank}
        if not broken:
            report["all"] = {**timed, **({"a2a_results": timed["results"]} if spec.get("alltoall") else {})}
        return result("ORCH-COLLECTIVE-REPORT " + json.dumps(report) + "\n")

    def stop(self, name, args):
        # by the cluster's id (the one its processes were started with), never by its name
        assert list(args)[1:] == [self.manifest.ray.temp_dir] and len(args[0]) == 16 and int(args[0], 16) >= 0
        assert self.cluster_id in (None, args[0])
        self.cluster_id = args[0]
        if name in self.denied:
            return result(json.dumps({"killed": 0, "alive": [], "names": [], "denied": {"4242": "cannot read its environment"}}))
        names = []
        if name in self.running or name in self.leftovers:
            names += ["raylet", "gcs_server"] if name == "head" else ["raylet"]
        if name in self.vllm:
            names += ["VLLM::EngineCore"]
        self.running.pop(name, None)
        self.leftovers.discard(name)
        self.vllm.discard(name)
        if name == "head":
            self.head_up.clear()
        return result(json.dumps({"killed": len(names), "alive": [], "names": names}))

    def drain(self, name, args, env):
        self.drains.append((name, tuple(args), dict(env or {})))
        self.draining.add(args[args.index("--node-id") + 1])
        return result()

    def actors(self):
        """``/api/v0/actors?detail=true`` of the simulated Serve (the shape of Ray 2.60's answer)."""
        ids = {n: s.node_id for n, s in self.running.items()}
        names = {v: k for k, v in ids.items()}
        targets = [n for n in self.running if ids[n] not in self.draining]
        moved = []
        for node, model in self.engines:
            if ids.get(node) in self.draining and node not in self.stuck and targets:
                others = [t for t in targets if t != node]
                node = others[0] if others else node
            moved.append((node, model))
        self.engines = moved
        rows = [{"actor_id": f"a{i}", "class_name": f"ServeReplica:orch-r1:LLMServer:{model}", "state": "ALIVE",
                 "name": f"SERVE_REPLICA::orch-r1#LLMServer:{model}#{i}", "node_id": ids.get(node), "pid": 100 + i,
                 "placement_group_id": f"pg{i}"} for i, (node, model) in enumerate(self.engines) if node in ids]  # fmt: skip
        rows.append({"actor_id": "c", "class_name": "ServeController", "state": "ALIVE", "name": "SERVE_CONTROLLER_ACTOR",
                     "node_id": ids.get("head"), "pid": 7, "placement_group_id": None})  # fmt: skip
        assert all(names.get(r["node_id"]) for r in rows if r["node_id"])
        return {"result": True, "msg": "", "data": {"result": {"total": len(rows), "result": rows}}}

    def ray(self, name, args, env):
        if args[0] == "drain-node":
            return self.drain(name, args, env)
        assert args[0] == "start"
        assert "ORCH_CLUSTER" not in env
        assert len(env["ORCH_CLUSTER_ID"]) == 16 and int(env["ORCH_CLUSTER_ID"], 16) >= 0
        assert self.cluster_id in (None, env["ORCH_CLUSTER_ID"])  # one id per cluster, kept across starts
        self.cluster_id = env["ORCH_CLUSTER_ID"]
        assert env["RAY_SERVE_HAPROXY_SOCKET_PATH"].startswith(self.manifest.ray.temp_dir + "/hap/")
        if self.start_barrier is not None:  # every node's `ray start` must be running at once
            self.start_barrier.wait(timeout=5)
        assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN_PATH"] == "/home/ops/.orch/nodes/tb/ray-token"
        if self.start_fails.get(name, 0) > 0:
            self.start_fails[name] -= 1
            return result(exit_code=1, stderr=self.start_error)
        if "--head" not in args:
            # A worker waits for the head's GCS (Ray's retry loop) as long as its env says.
            assert env["RAY_gcs_server_port_wait_time_s"] == "60"
            if not self.head_up.wait(timeout=2.0):
                return result(exit_code=1, stderr="RuntimeError: Failed to connect to GCS within 60 seconds.")
        if name in self.running or name in self.leftovers:
            return result(exit_code=1, stderr="Ray is already running")
        if name not in self.never_joins:
            with self.lock:
                self.serial += 1
                serial = self.serial
            gpus = float(args[args.index("--num-gpus") + 1])
            self.running[name] = NodeState(
                node_id=f"id-{name}-{serial}", name=name, address=ray_node_ip(args[args.index("--node-ip-address") + 1]),
                state="ALIVE", is_head="--head" in args, resources_total={"GPU": gpus, "CPU": 4.0, node_resource(name): 1000.0},
                start_time_ms=serial,
            )  # fmt: skip
        if "--head" in args:
            self.head_up.set()
        return result("Ray runtime started.")

    def kill_raylet(self, name):
        s = self.running.pop(name)
        if name == "head":
            self.head_up.clear()
        self.dead.append(replace(s, state="DEAD", state_message="health check failed due to missing too many heartbeats"))

    def head_gone(self):
        """Every Ray process of the cluster died (e.g. the machines rebooted)."""
        self.running.clear()
        self.head_up.clear()

    @contextmanager
    def open_runners(self, manifest):
        yield {n.name: self.runners[n.name] for n in manifest.nodes}

    @contextmanager
    def open_dashboard(self, runner, port, token):
        self.dashboard_opens.append((runner.node, port, token))
        world = self

        class Client:
            def nodes_with_usage(self):
                if "head" not in world.running:
                    raise DashboardUnavailable("the Ray dashboard at http://127.0.0.1:18265 did not answer")
                return world.dead + [replace(s, resources_used=dict(world.used.get(n, {}))) for n, s in world.running.items()]

            def get_json(self, path, params=None):
                assert path == "/api/v0/actors" and params == {"detail": "true", "limit": "10000"}
                if "head" not in world.running:
                    raise DashboardUnavailable("the Ray dashboard at http://127.0.0.1:18265 did not answer")
                return world.actors()

            def ray_version(self):
                return "2.60.0"

        yield Client()

    def gather(self, runners, manifest):
        out = {}
        for n in manifest.nodes:
            if n.name in self.unreachable:
                out[n.name] = UnreachableError(f"{n.name}: connection refused", node=n.name)
            else:
                addr = "192.168.7." + n.host.rsplit(".", 1)[1]
                nic = NicInfo("eth1", "up", 1500, (NicAddress("inet", addr, 24),))
                out[n.name] = NodeFacts(node=n.name, host=n.host, nics=(nic,), versions=Versions(ray="2.60.0"))
        return out

    def ray_calls(self, node=None, verb=None):
        """Calls that stop (the stop script) or start (`ray start`) Ray, per node in order."""
        calls = []
        for name, r in self.runners.items():
            if node and name != node:
                continue
            for c in r.calls:
                v = self.verb(c.argv)
                if v and (verb is None or v == verb):
                    calls.append(c)
        return calls

    def verb(self, argv):
        if argv[:3] == (PY, "-c", source("stop_ray")):
            return "stop"
        if argv[:4] == (PY, "-m", "ray.scripts.scripts", "start"):
            return "start"
        return None

    def verbs(self, node):
        return [self.verb(c.argv) for c in self.ray_calls(node)]
