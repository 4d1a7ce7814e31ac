"""Fault injection (issue 12, Done-when): a rollout is stopped at each of its steps by each kind of
fault; afterwards the revision that served before serves again, and the next `orch rollout`
repairs and explains what an interrupted one left.

Faults, at the first call of a step:
- ``sigint``: Ctrl-C (KeyboardInterrupt raised where the step calls out);
- ``dashboard_error``: the Serve REST API refuses the call (an HTTP 400 from the dashboard);
- ``tunnel_drop``: the SSH tunnel to the head is gone for the rest of this orch run: every Serve
  call gets no answer, every probe fails, every node command is unreachable;
- ``sigkill``: orch is SIGKILLed (a forked child runs the rollout and kills itself at the step;
  nothing of orch's own cleanup runs; Serve's state is what the fake kept in its file).

The world is tests/workflows/rollout_world.py: a scripted declarative Serve, an endpoint that
answers only where an application runs, a real state database, an injected clock.
"""

from __future__ import annotations

import os
import signal

import pytest

from orchestrator import cluster_lock
from orchestrator.cluster_lock import ClusterBusy
from orchestrator.errors import RolloutFailed, RolloutInterrupted, ServeError, UnreachableError
from orchestrator.serve.ray_io.client import ServeApiError
from orchestrator.workflows.rollout import RolloutOptions
from tests.workflows.rollout_world import KEY, MANIFEST, FakeServe, ServeEndpoint, _nodes, make_world

SIDE_BY_SIDE_STEPS = ["model_path", "apply", "wait", "probe", "switch", "wait_switch", "probe_live", "record_ready"]
IN_PLACE_STEPS = ["model_path", "apply", "wait", "probe", "record_ready"]
FAULTS = ["sigint", "dashboard_error", "tunnel_drop", "sigkill"]
OPTIONS = RolloutOptions(timeout_s=60, probe_timeout_s=10)
SECRET = "hf_secret-for-fault-tests"
IN_PLACE = RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True)


class Injector:
    """Wraps the world's Serve API, endpoint, runners and state so that ``fault`` happens at the
    first call of ``step`` of the rollout that follows ``arm()``."""

    def __init__(self, world, step: str, fault: str) -> None:
        self.world, self.step, self.fault = world, step, fault
        self.applies = 0
        self.fired = False
        self.dead = False

    def _fire(self, where: str | None) -> None:
        if self.dead:
            raise ServeApiError("the Ray dashboard at http://127.0.0.1:40000 did not answer GET /api/serve/applications/: ConnectError")
        if where != self.step or self.fired:
            return
        self.fired = True
        if self.fault == "sigint":
            raise KeyboardInterrupt
        if self.fault == "dashboard_error":
            raise ServeApiError("Serve refused PUT /api/serve/applications/ (400): invalid config", status_code=400)
        if self.fault == "tunnel_drop":
            self.dead = True
            raise ServeApiError("the Ray dashboard at http://127.0.0.1:40000 did not answer: ConnectError")
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)

    def arm(self) -> None:
        w = self.world
        serve, endpoint, state = w.serve, w.endpoint, w.state
        real_apply, real_status, real_probe, real_update = serve.apply, serve.status, endpoint.probe, state.update_revision

        def apply(body):
            self.applies += 1
            self._fire({1: "apply", 2: "switch"}.get(self.applies))
            return real_apply(body)

        def status():
            self._fire({1: "wait", 2: "wait_switch"}.get(self.applies))
            return real_status()

        def probe(route, model, key):
            if self.dead:
                return real_probe("/nowhere", model, key)
            self._fire("probe" if self.applies == 1 else "probe_live")
            return real_probe(route, model, key)

        def update_revision(cluster, number, status_, error=None):
            if status_ == "ready" and number == 2 and not self.dead:  # the state is local: no tunnel involved
                self._fire("record_ready")
            return real_update(cluster, number, status_, error=error)

        serve.apply, serve.status, endpoint.probe, state.update_revision = apply, status, probe, update_revision
        for runner in w.runners.values():
            real_run = runner.run

            def run(argv, timeout=60.0, env=None, _real=real_run, _node=runner.node):
                if self.dead:
                    raise UnreachableError(f"{_node}: lost the SSH connection", node=_node)
                if argv[:2] == ["test", "-f"] or tuple(argv[:2]) == ("test", "-f"):
                    try:
                        self._fire("model_path")
                    except ServeError as exc:  # on a node command, the same fault is the node going away
                        raise UnreachableError(f"{_node}: {exc.message}", node=_node) from None
                return _real(argv, timeout=timeout, env=env)

            runner.run = run

    def disarm(self) -> None:
        """A new orch process: a fresh connection to the same Serve, the same nodes and state."""
        w = self.world
        w.serve = FakeServe.load(w.serve.keep_in)
        w.endpoint = ServeEndpoint(w)
        for runner in w.runners.values():
            runner.__dict__.pop("run", None)
        w.state.__dict__.pop("update_revision", None)


@pytest.fixture
def world(tmp_path):
    w = make_world(tmp_path, MANIFEST + f"env: {{HF_TOKEN: {SECRET}}}\n")  # a secret the stored configs do not hold
    w.serve = FakeServe(keep_in=tmp_path / "serve.json")
    w.endpoint = ServeEndpoint(w)
    return w


def _rollout_in_child(world, run) -> int:
    """Run ``run`` in a forked child (the SIGKILL case); returns the signal that ended it."""
    pid = os.fork()
    if pid == 0:  # the child: an orch process
        try:
            run()
        except BaseException:
            os._exit(3)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)


def _old_revision_serves(world) -> None:
    assert set(world.serve.apps) == {"orch"}, world.serve.apps.keys()
    engine = world.serve.apps["orch"]["args"]["llm_configs"][0]["engine_kwargs"]
    assert engine["max_model_len"] == 1024 and engine["api_key"] == [KEY]
    assert world.serve.apps["orch"]["runtime_env"]["env_vars"]["HF_TOKEN"] == SECRET
    assert world.serve.apps["orch"]["route_prefix"] == "/"


def _run_faulted(world, step, fault, options, **request):
    """The faulted rollout; returns the error it raised (None when it was killed)."""
    injector = Injector(world, step, fault)
    injector.arm()
    if fault == "sigkill":
        ended = _rollout_in_child(world, lambda: world.rollout(options=options, **request))
        assert ended == signal.SIGKILL, f"the rollout did not reach step {step} (child ended with {ended})"
        injector.disarm()
        return None
    with pytest.raises((RolloutFailed, RolloutInterrupted)) as err:
        world.rollout(options=options, **request)
    assert injector.fired, f"the rollout never reached step {step}"
    injector.disarm()
    return err.value


def _check_outcome(world, step, fault, error) -> None:
    """What must hold after the fault, then after the next rollout."""
    statuses = {r.number: r.status for r in world.state.list_revisions("wf")}
    if fault in ("sigint", "dashboard_error"):
        # orch itself put the previous revision back before it exited, and said so.
        assert error.rolled_back and "revision 1 is serving" in error.message, error.message
        assert isinstance(error, RolloutInterrupted) == (fault == "sigint")
        assert statuses == {1: "ready", 2: "failed"}
        _old_revision_serves(world)
    elif fault == "tunnel_drop" and step != "model_path":
        # Serve cannot be reached to put it back: the revision stays pending and the error says
        # the next rollout repairs it.
        assert "stays pending" in error.hint and statuses == {1: "ready", 2: "pending"}
    elif fault == "sigkill":
        assert statuses[1] in ("ready", "superseded") and statuses[2] in ("pending", "ready")
    # The next rollout (of what served before) repairs whatever was left and then has nothing to do.
    again = world.rollout(options=OPTIONS)
    assert again.action == "noop" and again.revision == 1, again.decision
    _old_revision_serves(world)
    assert world.serve.state_of("orch") == "RUNNING"
    after = {r.number: r for r in world.state.list_revisions("wf")}
    assert after[1].status == "ready" and after[2].status == "failed" and after[2].error
    if fault in ("sigkill",) or (fault == "tunnel_drop" and step != "model_path"):
        assert again.repaired and "revision 2" in again.repaired[0] and "interrupted at step" in again.repaired[0]
        assert "interrupted at step" in after[2].error
    else:
        assert again.repaired == []


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("step", SIDE_BY_SIDE_STEPS)
def test_side_by_side_rollout_stopped_at_any_step_leaves_the_old_revision_serving(world, step, fault):
    world.rollout(options=OPTIONS)
    error = _run_faulted(world, step, fault, OPTIONS, max_model_len=2048)
    _check_outcome(world, step, fault, error)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("step", IN_PLACE_STEPS)
def test_in_place_rollout_stopped_at_any_step_brings_the_old_revision_back(world, step, fault):
    world.rollout(options=OPTIONS)
    world.nodes = _nodes(cpus_used=7.5)  # no room for a second copy
    error = _run_faulted(world, step, fault, IN_PLACE, max_model_len=2048)
    _check_outcome(world, step, fault, error)


def test_a_status_error_that_passes_is_retried_until_the_deadline_and_the_rollout_completes(world):
    world.rollout(options=OPTIONS)
    real_status = world.serve.status
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if 3 <= calls["n"] <= 6:  # the dashboard restarts, then a 503, while the candidate starts
            raise ServeApiError("Serve refused GET (503): unavailable", status_code=503 if calls["n"] > 4 else None)
        return real_status()

    world.serve.status = flaky
    res = world.rollout(options=OPTIONS, max_model_len=2048)
    assert res.action == "side_by_side" and calls["n"] > 6
    assert world.state.current_revision("wf").number == 2


def test_a_status_error_that_lasts_past_the_deadline_restores_and_names_it(world):
    world.rollout(options=OPTIONS)
    real_status, real_apply = world.serve.status, world.serve.apply
    down = {"until": -1.0}

    def status():
        if world.clock.now <= down["until"]:
            raise ServeApiError("the Ray dashboard did not answer: ConnectError")
        return real_status()

    def apply(body):
        real_apply(body)
        if len(world.serve.bodies) == 2:  # the candidate's PUT: no answer for longer than the wait
            down["until"] = world.clock.now + OPTIONS.timeout_s

    world.serve.status, world.serve.apply = status, apply
    with pytest.raises(RolloutFailed) as err:
        world.rollout(options=OPTIONS, max_model_len=2048)
    assert "Serve's status did not answer" in err.value.message and err.value.rolled_back
    _old_revision_serves(world)


def test_a_second_rollout_while_one_holds_the_cluster_is_refused_before_anything(world):
    world.rollout(options=OPTIONS)
    bodies = len(world.serve.bodies)
    with cluster_lock.hold(world.state.cluster_dir("wf"), "wf", "rollout"):
        with pytest.raises(ClusterBusy, match=r"cluster 'wf' is busy: `orch rollout` \(pid"):
            world.rollout(options=OPTIONS, max_model_len=2048)
        dry = world.rollout(options=RolloutOptions(dry_run=True), max_model_len=2048)  # looking needs no lock
    assert dry.action == "dry_run:side_by_side"
    assert len(world.serve.bodies) == bodies and [r.number for r in world.state.list_revisions("wf")] == [1]


def test_the_application_is_named_after_the_number_the_database_gave(world):
    """Issue 12 item 6: a revision number taken meanwhile (another writer) does not make two
    rollouts deploy the same orch-rN."""
    world.rollout(options=OPTIONS)
    real_add = world.state.add_revision

    def add_revision(cluster, model, **kw):
        if model != "elsewhere":
            real_add(cluster, "elsewhere")  # another writer takes number 2 just before this insert
        return real_add(cluster, model, **kw)

    world.state.add_revision = add_revision
    res = world.rollout(options=OPTIONS, max_model_len=2048)
    assert res.revision == 3 and [a["name"] for a in world.serve.bodies[1]["applications"]] == ["orch", "orch-r3"]
    assert world.state.get_revision("wf", 3).app_name == "orch"  # it serves as the live application
