"""A candidate whose replica failed to start, over the rollout's fakes: stop at once when the
failure is one a retry cannot fix, keep waiting (Serve retries) when it may pass.

Serve's messages are real: the deployment messages captured on the test bed while a replica
failed to start (tests/data/serve/start-failures/, SOURCES.md there), and the failed replica's
worker log from the same runs, read on its "node" by the doctor's real scan script (run here, on
a Ray-shaped session folder, as tests/unit/test_engine_logs.py does)."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.cluster.node_state import NodeState
from orchestrator.errors import RolloutFailed
from orchestrator.serve.ray_io.client import parse_serve_status
from orchestrator.workflows.rollout import RolloutOptions
from tests.runners import CountingRunner
from tests.workflows.rollout_world import make_world

DATA = Path(__file__).resolve().parents[1] / "data"
CAPTURES = DATA / "serve" / "start-failures"
HEALTHY_REPLICA_LOG = DATA / "logs" / "engine" / "ray-serve-llm-cpu-replica-worker.out"


def _capture(name: str) -> dict:
    return json.loads((CAPTURES / name).read_text())


def _message(name: str) -> str:
    """The candidate's engine deployment message in a captured ``GET /api/serve/applications/``."""
    apps = parse_serve_status(_capture(name)).applications
    return next(d.message for a in apps.values() for d in a.deployments if d.name.startswith("LLMServer") and d.message.strip())


class ScanCountingRunner(CountingRunner):
    def scans(self) -> int:
        """How many log scans (the doctor's node-side program) it ran."""
        return sum(1 for argv in self.calls if len(argv) > 2 and argv[1] == "-c" and "session_latest" in argv[2])


@pytest.fixture
def temp():
    # A short folder: the manifest refuses a ray.temp_dir long enough to break Ray's unix sockets.
    path = Path(tempfile.mkdtemp(prefix="osf", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# The test bed's addresses in the wrong-interface capture (10.170.162.10 is host0, the head; the
# failed replica ran on host2 as pid 214).
HOSTS = {"host0": "10.170.162.10", "host1": "10.170.162.11", "host2": "10.170.162.12"}
REPLICA_LOGS = {p.name: p.read_text() for p in sorted(CAPTURES.glob("worker-*-214.*"))}


def _world(tmp_path: Path, temp: Path, logs: dict[str, dict[str, str]] | None = None):
    """The rollout's fake world on three nodes with the test bed's addresses; ``logs``: node ->
    {file name under session_latest/logs: text}."""
    nodes = "\n".join(f"  - {{name: {n}, host: {ip}{', role: head' if n == 'host0' else ''}, gpus: 0, cpus: 8}}" for n, ip in HOSTS.items())
    text = f"name: wf\naccelerator: cpu\npython: {sys.executable}\nnodes:\n{nodes}\nserve: {{http_port: 8000, api_key_env: WF_KEY}}\nray: {{temp_dir: {temp}}}\n"
    w = make_world(tmp_path, manifest_text=text)
    for node, files in (logs or {}).items():
        folder = temp / node / "session_2026-12-02_11-00-00_000000_1" / "logs"
        folder.mkdir(parents=True)
        (temp / node / "session_latest").symlink_to(folder.parent.name)
        for name, content in files.items():
            (folder / name).write_text(content)
    w.runners = {n: ScanCountingRunner(n) for n in HOSTS}
    w.nodes = [NodeState(f"n-{n}", n, ip, "ALIVE", n == "host0", {"CPU": 8.0}, {"CPU": 0.0}) for n, ip in HOSTS.items()]
    return w


def _serving(w):
    """Revision 1 serves; the next rollout (a changed config) goes side by side."""
    w.rollout()
    return w


def _fail_candidate(w, messages: list[str], tail: str = "DEPLOYING"):
    """The candidate orch-r2 stays DEPLOYING for 50 polls with these deployment messages (the last
    repeating), then ``tail``: time enough for Serve's retries, were orch to wait for them."""
    w.serve.scripts["orch-r2"] = ["DEPLOYING"] * 50 + [tail]
    w.serve.messages["orch-r2"] = messages


def test_serve_giving_up_before_a_poll_saw_it_retry_still_names_the_cause(tmp_path, temp):
    """Three fast failures between two polls: Serve's DEPLOY_FAILED message (captured: a model
    folder missing on the node) is read like a retrying one; the message itself shows the
    cause, so no log is read on the node."""
    w = _serving(_world(tmp_path, temp))
    gave_up = parse_serve_status(json.loads((DATA / "serve" / "applications_deploy_failed.json").read_text()))
    w.serve.scripts["orch-r2"] = ["DEPLOYING", "DEPLOY_FAILED"]
    w.serve.message = gave_up.app("orch-r3").deployment("LLMServer:tiny").message
    with pytest.raises(RolloutFailed) as err:
        w.rollout(max_num_seqs=32)
    message = err.value.message
    assert message.startswith("revision 2 failed: application orch-r2 is DEPLOY_FAILED: a replica of orch-r2 failed to start "
                              "with MODEL_PATH_NOT_FOUND (Model directory missing on a node), which a retry cannot fix: ")
    assert "'/nonexistent/models/tiny'" in message and message.endswith("; revision 1 is serving")
    assert "Serve would have tried" not in message  # it gave up: nothing left to save
    assert err.value.hint.endswith("runbooks/MODEL_PATH_NOT_FOUND.md") and err.value.rolled_back
    assert sum(r.scans() for r in w.runners.values()) == 0
    assert [a["name"] for a in w.serve.bodies[-1]["applications"]] == ["orch"]  # the candidate is gone
    assert w.state.get_revision("wf", 2).status == "failed" and w.state.current_revision("wf").number == 1


def test_a_wrong_interface_stops_the_candidate_at_its_first_failed_start(tmp_path, temp):
    """Serve's message says only that the engine core failed; the failed replica's log on its
    node says why (a loopback peer): the rollout stops at that poll, not after Serve's retries,
    puts nothing but the serving revision back and names the code with its runbook."""
    message = _message("wrong-nic-retrying.json")
    assert "Retrying 2 more time(s)" in message and "Engine core initialization failed" in message
    w = _serving(_world(tmp_path, temp, {"host2": REPLICA_LOGS}))
    _fail_candidate(w, ["", "", message])
    started = w.clock.now
    with pytest.raises(RolloutFailed) as err:
        w.rollout(max_num_seqs=32)
    text = err.value.message
    assert text.startswith("revision 2 failed: a replica of orch-r2 failed to start with COLLECTIVE_PEER_LOOPBACK (A NCCL/Gloo "
                           "rank was told to reach its peer at a loopback address), which a retry cannot fix (Serve would have "
                           "tried 2 more time(s)): host2:logs/worker-3286665c72109b0157ea72938626e8f48f5b05cea1a22c84019ef946-"
                           "01000000-214.err:")  # fmt: skip
    assert "ERROR failed to connect, willRetry=0" in text and "remote=[127.0.0.1]:15272" in text
    assert "the same loopback address again" in text and text.endswith("; revision 1 is serving")
    assert err.value.hint.endswith("runbooks/COLLECTIVE_PEER_LOOPBACK.md") and err.value.rolled_back
    # Stopped at the first poll that showed the failure (the third: two 2 s poll intervals after
    # the apply), not after 50 polls of Serve's retries.
    assert w.clock.now - started == 2 * RolloutOptions().poll_s
    # One scan, on the failed replica's node only.
    assert [r.scans() for r in w.runners.values()] == [0, 0, 1]
    assert [a["name"] for a in w.serve.bodies[-1]["applications"]] == ["orch"]
    assert w.state.current_revision("wf").number == 1 and w.state.get_revision("wf", 2).status == "failed"
    assert "COLLECTIVE_PEER_LOOPBACK" in (w.state.get_revision("wf", 2).error or "")


def test_a_cause_in_serves_message_stops_without_reading_the_node(tmp_path, temp):
    """An architecture vLLM does not implement (captured: a config error, in the replica's own
    traceback in Serve's message): the rollout stops at that poll and reads no log."""
    w = _serving(_world(tmp_path, temp, {"host0": {}}))
    _fail_candidate(w, ["", _message("bad-arch-retrying.json")])
    with pytest.raises(RolloutFailed) as err:
        w.rollout(max_num_seqs=32)
    assert "a replica of orch-r2 failed to start with MODEL_ARCH_UNSUPPORTED" in err.value.message
    assert "Serve's message for LLMServer:tiny:" in err.value.message and "['OrchNoSuchForCausalLM']" in err.value.message
    assert err.value.hint.endswith("runbooks/MODEL_ARCH_UNSUPPORTED.md")
    assert sum(r.scans() for r in w.runners.values()) == 0
    assert [a["name"] for a in w.serve.bodies[-1]["applications"]] == ["orch"]


def test_a_failure_whose_log_shows_no_such_cause_keeps_serves_retries_and_is_read_once(tmp_path, temp):
    """The same message, but the replica's log holds only a healthy engine's lines: nothing says
    a retry cannot fix it, so the rollout waits while Serve retries (the message read once,
    however many polls show it), and the next attempt comes up."""
    healthy = HEALTHY_REPLICA_LOG.read_text()
    w = _serving(_world(tmp_path, temp, {"host2": {name: healthy for name in REPLICA_LOGS}}))
    progress: list[str] = []
    w.deps.progress = progress.append
    w.serve.scripts["orch-r2"] = ["DEPLOYING"] * 6 + ["RUNNING"]
    w.serve.messages["orch-r2"] = ["", _message("wrong-nic-retrying.json"), _message("wrong-nic-retrying.json"),
                                   _message("wrong-nic-scheduling.json"), ""]  # fmt: skip
    res = w.rollout(max_num_seqs=32)
    assert res.action == "side_by_side" and w.state.current_revision("wf").number == 2
    assert [r.scans() for r in w.runners.values()] == [0, 0, 1]
    said = [m for m in progress if "failed to start" in m]
    assert said == ["LLMServer:tiny: a replica failed to start (RuntimeError: Engine core initialization failed. See root cause "
                    "above. Failed core proc(s): {}); Serve retries it 2 more time(s): nothing in Serve's message or the "
                    "replica's log on host2 shows a failure a retry cannot fix"]  # fmt: skip


def test_a_slow_start_is_not_a_failed_one(tmp_path, temp):
    """Serve's "taken more than 30s to be scheduled" (captured while the wrong-interface
    candidate waited for its placement) is no start failure: nothing is read on the nodes."""
    w = _serving(_world(tmp_path, temp))
    w.serve.scripts["orch-r2"] = ["DEPLOYING"] * 3 + ["RUNNING"]
    w.serve.messages["orch-r2"] = [_message("wrong-nic-scheduling.json")]
    assert w.rollout(max_num_seqs=32).action == "side_by_side"
    assert sum(r.scans() for r in w.runners.values()) == 0


def test_a_surge_replica_that_cannot_start_puts_the_old_config_back(tmp_path, temp):
    """After the candidate answered, the live application takes its config and the new replica
    fails to start with a cause no retry fixes: orch stops there and Serve gets the old config
    back, instead of Serve trying again while the old replica keeps serving."""
    w = _serving(_world(tmp_path, temp, {"host2": REPLICA_LOGS}))
    old_config = w.serve.apps["orch"]
    w.serve.scripts["orch"] = ["DEPLOYING", "DEPLOYING", "RUNNING"]  # r1 rolls (the switch), then it is put back
    message = _message("wrong-nic-retrying.json")
    w.serve.messages["orch"] = ["", message, ""]
    with pytest.raises(RolloutFailed, match="a replica of orch failed to start with COLLECTIVE_PEER_LOOPBACK") as err:
        w.rollout(max_num_seqs=32)
    assert err.value.rolled_back
    restored = w.serve.bodies[-1]["applications"]
    assert [a["name"] for a in restored] == ["orch"]
    assert restored[0]["args"] == old_config["args"]
    assert w.state.current_revision("wf").number == 1
