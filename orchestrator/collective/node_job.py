"""The collective check's job on one node. Runs THERE, with the node's python: stdlib + torch only.

orch never imports this module: ``orchestrator.workflows.collective`` reads its source and runs it
as ``python -c SOURCE orch-collective SPEC_JSON`` on every node (``orchestrator.collective.plan``
builds the argv and the spec). One process per node; rank 0 is the hub (the head).

1. rendezvous: the hub hosts a TCPStore on its address; every other rank joins it and says so.
   The hub waits up to ``timeout_s`` for the joins (torch starts at each node's own pace).
2. pairs: each worker forms a 2-rank group with the hub. In that group the worker is rank 0 and
   the hub rank 1, so the hub connects to the address the worker's backend advertises on its
   interface (the way the workers' peers will), not only the worker to the hub (which preflight's
   TCP test already did). The hub forms every pair at once (threads) and times them one after
   another, so their figures do not share its NIC.
3. all: if every pair worked, one group over all ranks.
Each group first checks one all-reduce's sum, then times all-reduces at the spec's sizes.

Bounded: every wait has ``timeout_s``; a watchdog writes the report and exits at ``deadline_s``
whatever the backend is doing, and the hub keeps its store up until the workers that joined are
done with it. Prints one line ``ORCH-COLLECTIVE-REPORT {json}`` on stdout (NCCL's INFO lines go
to stdout too) and exits with os._exit, so no backend thread can keep the process alive.
"""

import json
import os
import sys
import threading
import time
from datetime import timedelta

MARK = "ORCH-COLLECTIVE-REPORT "
WARMUP = 2


def _message(exc):
    text = str(exc).strip() or repr(exc)
    return f"{type(exc).__name__}: {text[:4000]}"


def _links():
    """Link speed (Mb/s, as the kernel reports it; None when it has none) of every interface."""
    out = {}
    base = "/sys/class/net"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(base, name, "speed")) as f:
                out[name] = int(f.read().strip())
        except (OSError, ValueError):
            out[name] = None
    return out


class Job:
    def __init__(self, spec):
        self.spec = spec
        self.rank, self.world = spec["rank"], spec["world"]
        self.timeout = timedelta(seconds=spec["timeout_s"])
        self.report = {"rank": self.rank, "world": self.world, "backend": spec["backend"], "links": _links(),
                       "pid": os.getpid(), "stage": "import"}
        self.t_start = time.monotonic()
        self.lock = threading.Lock()

    def emit(self, code):
        with self.lock:  # the watchdog and the main thread: the first one writes and exits
            self.report["seconds"] = round(time.monotonic() - self.t_start, 3)
            sys.stdout.write(MARK + json.dumps(self.report) + "\n")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def fail(self, stage, exc, code):
        self.report["error"] = {"stage": stage, "message": _message(exc)}
        self.emit(code)

    def watchdog(self):
        stage = self.report.get("stage")
        self.report["error"] = {"stage": stage, "message": f"TimeoutError: no progress in {stage} within the "
                                f"check's deadline ({self.spec['deadline_s']} s)"}
        self.emit(6)

    def backend(self):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.report["torch"] = torch.__version__
        if self.spec["backend"] == "nccl":
            if not torch.cuda.is_available():
                raise RuntimeError(f"torch {torch.__version__} sees no CUDA device here: NCCL needs one")
            torch.cuda.set_device(int(self.spec.get("device", 0)))
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.report["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        else:
            self.device = torch.device("cpu")

    def sync(self):
        if self.spec["backend"] == "nccl":
            self.torch.cuda.synchronize()

    def make_pg(self, store, r, n):
        dist = self.dist
        if self.spec["backend"] == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            return dist.ProcessGroupNCCL(store, r, n, opts)
        return dist.ProcessGroupGloo(store, r, n, self.timeout)

    def group(self, name, r, n, bench_lock=None):
        """Form a group, check one sum, time the sizes: {ok, error, init_seconds, results}."""
        torch = self.torch
        out = {"ok": False}
        t = time.monotonic()
        try:
            pg = self.make_pg(self.dist.PrefixStore(name, self.store), r, n)
            probe = torch.full((1024,), float(r + 1), device=self.device)
            pg.allreduce([probe]).wait()
            self.sync()
            want, got = n * (n + 1) / 2, float(probe[0].item())
            out["init_seconds"] = round(time.monotonic() - t, 3)
            if got != want:
                out["error"] = f"ValueError: wrong all-reduce sum {got} (expected {want})"
                return out
            if bench_lock is not None:
                bench_lock.acquire()
            try:
                results = []
                for size, iters in zip(self.spec["sizes"], self.spec["iters"]):
                    buf = torch.zeros(max(1, size // 4), dtype=torch.float32, device=self.device)
                    for _ in range(WARMUP):
                        pg.allreduce([buf]).wait()
                    self.sync()
                    t1 = time.perf_counter()
                    for _ in range(iters):
                        pg.allreduce([buf]).wait()
                    self.sync()
                    results.append({"bytes": size, "iters": iters, "seconds": (time.perf_counter() - t1) / iters})
                out["results"] = results
            finally:
                if bench_lock is not None:
                    bench_lock.release()
            out["ok"] = True
        except Exception as exc:
            out["error"] = _message(exc)
            out["seconds"] = round(time.monotonic() - t, 3)
        return out

    def hub(self):
        world, timeout_s = self.world, self.spec["timeout_s"]
        joined, deadline = set(), time.monotonic() + timeout_s
        while len(joined) < world - 1 and time.monotonic() < deadline:
            joined |= {w for w in range(1, world) if w not in joined and self.store.check([f"joined/{w}"])}
            time.sleep(0.05)
        self.report["joined"] = sorted(joined)
        pairs = {str(w): {"ok": False, "error": f"TimeoutError: did not reach the rendezvous within {timeout_s} s"}
                 for w in range(1, world) if w not in joined}
        self.report["stage"] = "pairs"
        self.report["pairs"] = pairs  # filled in as the pairs finish: the watchdog reports those done
        bench_lock = threading.Lock()

        def pair(w):
            pairs[str(w)] = self.group(f"pair{w}/", 1, 2, bench_lock)

        threads = [threading.Thread(target=pair, args=(w,), daemon=True) for w in sorted(joined)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        go = all(p["ok"] for p in pairs.values())
        self.store.set("all/go", "1" if go else "0")
        return go, joined

    def main(self):
        spec = self.spec
        watchdog = threading.Timer(spec["deadline_s"], self.watchdog)
        watchdog.daemon = True
        watchdog.start()
        try:
            self.backend()
        except Exception as exc:  # torch missing or unusable: the node's own words
            self.fail("import", exc, 3)
        self.report["stage"] = "rendezvous"
        t0 = time.monotonic()
        try:
            self.store = self.dist.TCPStore(spec["store_host"], spec["store_port"], None, self.rank == 0,
                                            self.timeout, wait_for_workers=False)
            if self.rank != 0:
                self.store.set(f"joined/{self.rank}", "1")
        except Exception as exc:
            self.fail("rendezvous", exc, 4)
        self.report["rendezvous_seconds"] = round(time.monotonic() - t0, 3)
        try:
            if self.rank == 0:
                go, joined = self.hub()
            else:
                self.report["stage"] = "pairs"
                self.report["pair"] = self.group(f"pair{self.rank}/", 0, 2)
                go = self.store.get("all/go") == b"1"
            self.report["stage"] = "all"
            if go:
                self.report["all"] = self.group("all/", self.rank, self.world)
            # The store lives in the hub's process: it leaves once every worker that joined is
            # done with it (bounded by the timeout), so no worker loses it mid-way.
            self.report["stage"] = "finish"
            if self.rank == 0:
                if joined:
                    self.store.wait([f"done/{r}" for r in sorted(joined)], self.timeout)
            else:
                self.store.set(f"done/{self.rank}", "1")
        except Exception as exc:
            self.fail(self.report["stage"], exc, 5)
        self.report["stage"] = "done"
        self.emit(0)


if __name__ == "__main__":
    Job(json.loads(sys.argv[-1])).main()
