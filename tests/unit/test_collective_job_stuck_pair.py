"""The collective job (orchestrator/remote/node_programs/collective_job.py) run for real: three processes, Gloo over
loopback, the job's own source and the spec orch builds. Rank 1 is a node that never takes part in
the all-to-all mesh (its spec asks for none), so its pairs with ranks 0 and 2 wait for a peer that
never comes, up to the group timeout. The pair of ranks 0 and 2 must still form and pass: each
group formed in a thread rendezvous through a store client of its own.

Seen on the 3-host test bed before the fix (CI and here): with one pair of workers cut off, every
pair failed, the head's too, because one TCPStore client serializes its calls and the stuck pair's
wait held it for the whole timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from orchestrator.collective.plan import CollectivePlan, job_argv, job_spec
from orchestrator.remote.node_programs.collective_job import MARK

pytest.importorskip("torch.distributed")

TIMEOUT_S = 4  # the group timeout for this run: the stuck pairs give up after it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_pair_that_never_forms_does_not_hold_up_the_other_pairs_of_its_ranks():
    plan = CollectivePlan(backend="gloo", ranks=("n0", "n1", "n2"), store_host="127.0.0.1",
                          interfaces={"n0": "lo", "n1": "lo", "n2": "lo"}, addresses={}, alltoall=True)  # fmt: skip
    port = _free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    procs = []
    for rank in range(3):
        spec = {**job_spec(plan, rank, port), "timeout_s": TIMEOUT_S, "join_timeout_s": 60, "deadline_s": 120,
                "sizes": [1024], "iters": [2]}  # fmt: skip
        if rank == 1:
            spec["alltoall"] = False  # this rank never forms its mesh pairs
        procs.append(subprocess.Popen(job_argv(sys.executable, spec), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True))  # fmt: skip
    reports = []
    for p in procs:
        out, _ = p.communicate(timeout=180)
        lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
        assert lines, out[-2000:]
        reports.append(json.loads(lines[-1][len(MARK):]))
    hub, _, last = reports
    assert hub["pairs"]["1"]["ok"] and hub["pairs"]["2"]["ok"], hub["pairs"]  # the pairs with the hub all formed
    # The stuck pairs are named by their timeout; the pair beside them formed and exchanged.
    assert hub["mesh"]["1"]["ok"] is False and "within" in hub["mesh"]["1"]["error"], hub["mesh"]
    assert last["mesh"]["1"]["ok"] is False, last["mesh"]
    assert hub["mesh"]["2"]["ok"] is True and last["mesh"]["0"]["ok"] is True, (hub["mesh"], last["mesh"])
    assert hub["mesh"]["2"].get("results") and last["mesh"]["0"].get("results")  # and was timed
