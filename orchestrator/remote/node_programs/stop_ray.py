"""Stops one orch cluster's processes on this node (`orch down`, and `orch up` before a start):
the processes of the invoking user that name the cluster's temp dir (argv[2]) in a long option or
carry its id (argv[1]) in ORCH_CLUSTER_ID, and their descendants; see ``cluster/ray_nodes.py``,
``stop_argv``. Prints one JSON object ``{killed, alive, names, denied}``.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import importlib.util
import json
import os
import sys
import time


def main() -> None:
    try:
        import psutil
    except ImportError:  # Ray vendors psutil under ray/thirdparty_files
        spec = importlib.util.find_spec("ray")
        sys.path.insert(0, os.path.join(list(spec.submodule_search_locations)[0], "thirdparty_files"))
        import psutil
    cid, temp = sys.argv[1], os.path.normpath(sys.argv[2])
    if len(cid) < 16 or not all(c in "0123456789abcdef" for c in cid):
        cid = None  # no id recorded (state lost): match the temp dir only
    def under_temp(value):
        return value == temp or value.startswith(temp + "/")
    def names_temp(cmd):  # a long option's value (--opt=V or --opt V) is T or under T/
        prev = ""
        for arg in cmd:
            if arg.startswith("--") and "=" in arg and under_temp(arg.split("=", 1)[1]):
                return True
            if prev.startswith("--") and "=" not in prev and under_temp(arg):
                return True
            prev = arg
        return False
    me = os.getuid()
    spare = {os.getpid()} | {p.pid for p in psutil.Process().parents()}
    roots, denied = [], {}
    for p in psutil.process_iter(["cmdline", "uids"]):
        if p.pid in spare:
            continue
        uids = p.info["uids"]
        if uids is None or me not in (uids.real, uids.effective):
            continue  # another user's process is never ours to stop
        try:
            if names_temp(p.info["cmdline"] or ()) or (cid is not None and p.environ().get("ORCH_CLUSTER_ID") == cid):
                roots.append(p)
        except psutil.AccessDenied:
            denied[p.pid] = "cannot read its environment"
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    victims = {}
    for p in roots:
        victims[p.pid] = p
        try:
            for c in p.children(recursive=True):
                if c.pid not in spare and me in (c.uids().real, c.uids().effective):
                    victims[c.pid] = c
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    names = set()
    for p in list(victims.values()):
        try:
            names.add(p.name())
            p.kill()
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            denied[p.pid] = "not allowed to kill it"
            del victims[p.pid]
    def dead(p):  # a zombie is dead; its parent (not us) reaps it
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
    deadline = time.monotonic() + 15
    alive = list(victims.values())
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if not dead(p)]
        if alive:
            time.sleep(0.1)
    print(json.dumps({"killed": len(victims) - len(alive), "alive": [p.pid for p in alive], "names": sorted(names),
                      "denied": {str(k): v for k, v in sorted(denied.items())}}))


if __name__ == "__main__":
    main()
