"""The collective check's job on one node. Runs THERE, with the node's python: stdlib + torch only.

orch's own code never imports this module: ``orchestrator.collective.plan.job_argv`` runs it whole
as ``python -c SOURCE orch-collective SPEC_JSON`` on every node (``node_programs.python_argv``;
``orchestrator.workflows.collective`` starts it). One process per node; rank 0 is the hub (the head).

1. rendezvous: the hub hosts a TCPStore on its address; every other rank joins it and says so.
   The hub waits up to ``join_timeout_s`` for the joins (torch starts at each node's own pace);
   the workers that joined wait for it to start the pairs.
2. pairs: each worker forms a 2-rank group with the hub. In that group the worker is rank 0 and
   the hub rank 1, so the hub connects to the address the worker's backend advertises on its
   interface (the way the workers' peers will), not only the worker to the hub (which preflight's
   TCP test already did). The hub forms every pair at once (threads) and times them one after
   another, so their figures do not share its NIC.
3. mesh (when the spec asks for the all-to-all, ``alltoall``): every pair of ranks, workers
   included, forms its own 2-rank group and checks one all-to-all whose chunks say where they
   came from. Expert parallelism sends all-to-all traffic between every pair of GPUs, so a pair
   that cannot connect is named here, by pair. Each rank forms all its pairs at once (threads,
   each bounded by ``timeout_s``: a connect that ignores the group timeout cannot stall the
   check), then the pairs are timed in rounds (the circle method: each rank in one pair per
   round, so no two timed pairs share a rank's link).
Every group (the hub's pairs and every pair of the mesh are formed at once, in threads) rendezvous
through a store client of its own: one TCPStore client serializes its calls, so a group waiting
for a peer's key that never comes held up every other group of that rank until its timeout (seen
on the 3-host bed: with one pair of workers cut off, the head's pairs with both workers failed too).
4. all: if every pair worked, one group over all ranks.
Each group first checks one all-reduce's sum, then times all-reduces at the spec's sizes; with
``alltoall`` the group of all ranks also checks and times all-to-alls at the same sizes.

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
        self.join_timeout_s = spec.get("join_timeout_s", spec["timeout_s"])  # joining the rendezvous
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
        # The current stream, not the device: a pair stuck in another thread's communicator must
        # not hold up the others (ProcessGroupNCCL's work.wait() orders the current stream after
        # its own).
        if self.spec["backend"] == "nccl":
            self.torch.cuda.current_stream().synchronize()

    def client(self):
        """A store client of its own for one group's rendezvous (see the module doc)."""
        spec = self.spec
        return self.dist.TCPStore(spec["store_host"], spec["store_port"], None, False,
                                  timedelta(seconds=self.join_timeout_s))

    def make_pg(self, store, r, n):
        dist = self.dist
        if self.spec["backend"] == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            return dist.ProcessGroupNCCL(store, r, n, opts)
        return dist.ProcessGroupGloo(store, r, n, self.timeout)

    def a2a_check(self, pg, r, n):
        """One all-to-all (equal chunks): chunk j of rank i carries i * n + j, so every rank can
        tell it got each peer's chunk for it. None, or what was wrong."""
        torch = self.torch
        chunk = 256
        send = (torch.arange(n, dtype=torch.float32, device=self.device) + r * n).repeat_interleave(chunk)
        recv = torch.empty_like(send)
        pg.alltoall_base(recv, send, [], []).wait()
        self.sync()
        want = (torch.arange(n, dtype=torch.float32, device=self.device) * n + r).repeat_interleave(chunk)
        if not torch.equal(recv, want):
            got = [float(v) for v in recv[::chunk].tolist()]
            return f"ValueError: wrong all-to-all chunks {got} (expected {[float(v) for v in want[::chunk].tolist()]})"
        return None

    def time_op(self, pg, op, n, sizes, iters):
        """Seconds per call of an all-reduce ("allreduce") or an all-to-all ("alltoall") of each
        size in bytes (for the all-to-all: the bytes each rank sends in all, its own chunk included).

        Bounded on slow links: after one warm-up call (which may pay for connections), a second
        call is timed and its time agreed by all ranks (an all-reduce of it, so every rank makes
        the same choice); a size whose calls would take more than ``size_budget_s`` is timed over
        fewer calls, or by that second call alone."""
        torch = self.torch
        budget = float(self.spec.get("size_budget_s", 2.0))
        results = []
        for size, count in zip(sizes, iters):
            numel = max(n, size // 4 // n * n)  # equal chunks: at most 4(n-1) bytes under the size
            buf = torch.zeros(numel, dtype=torch.float32, device=self.device)
            out = torch.empty_like(buf)

            def call(buf=buf, out=out):
                if op == "allreduce":
                    pg.allreduce([buf]).wait()
                else:
                    pg.alltoall_base(out, buf, [], []).wait()

            for _ in range(WARMUP - 1):
                call()
            self.sync()
            t0 = time.perf_counter()
            call()
            self.sync()
            probe = self.agreed(pg, time.perf_counter() - t0, n)
            if probe > 0 and probe * (1 + count) > budget:
                count = int(budget / probe) - 1
            if count < 1:  # the probe is the measurement
                results.append({"bytes": size, "iters": 1, "seconds": probe})
                continue
            t1 = time.perf_counter()
            for _ in range(count):
                call()
            self.sync()
            results.append({"bytes": size, "iters": count, "seconds": (time.perf_counter() - t1) / count})
        return results

    def agreed(self, pg, value, n):
        """The mean of ``value`` over the group's ranks: the same number on every rank."""
        t = self.torch.tensor([float(value)], dtype=self.torch.float64, device=self.device)
        pg.allreduce([t]).wait()
        self.sync()
        return float(t.item()) / n

    def group(self, name, r, n, bench_lock=None, alltoall=False):
        """Form a group, check one sum, time the sizes: {ok, error, init_seconds, results}, and with
        ``alltoall`` also check one all-to-all and time it (a2a_results)."""
        torch = self.torch
        out = {"ok": False}
        t = time.monotonic()
        try:
            pg = self.make_pg(self.dist.PrefixStore(name, self.client()), r, n)
            probe = torch.full((1024,), float(r + 1), device=self.device)
            pg.allreduce([probe]).wait()
            self.sync()
            want, got = n * (n + 1) / 2, float(probe[0].item())
            out["init_seconds"] = round(time.monotonic() - t, 3)
            if got != want:
                out["error"] = f"ValueError: wrong all-reduce sum {got} (expected {want})"
                return out
            if alltoall:
                wrong = self.a2a_check(pg, r, n)
                if wrong:
                    out["error"] = wrong
                    return out
            if bench_lock is not None:
                bench_lock.acquire()
            try:
                out["results"] = self.time_op(pg, "allreduce", n, self.spec["sizes"], self.spec["iters"])
                if alltoall:
                    out["a2a_results"] = self.time_op(pg, "alltoall", n, self.spec["sizes"], self.spec["iters"])
            finally:
                if bench_lock is not None:
                    bench_lock.release()
            out["ok"] = True
        except Exception as exc:
            out["error"] = _message(exc)
            out["seconds"] = round(time.monotonic() - t, 3)
        return out

    def hub(self):
        world, timeout_s = self.world, self.join_timeout_s
        joined, deadline = set(), time.monotonic() + timeout_s
        while len(joined) < world - 1 and time.monotonic() < deadline:
            joined |= {w for w in range(1, world) if w not in joined and self.store.check([f"joined/{w}"])}
            time.sleep(0.05)
        self.report["joined"] = sorted(joined)
        self.store.set("pairs/start", "1")  # the workers that joined wait for this before pairing
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

    def mesh(self):
        """Every pair of ranks in its own group (see the module doc). Fills report["mesh"]
        ({peer: {ok, error, init_seconds, results}}) and returns whether the group of all ranks
        may form: every rank's every pair worked, as each rank published it."""
        world, r, timeout_s = self.world, self.rank, self.spec["timeout_s"]
        peers = [p for p in range(world) if p != r]
        done, groups = {}, {}

        def connect(p):
            lo, hi = min(r, p), max(r, p)
            me = 0 if r == lo else 1
            t = time.monotonic()
            try:
                pg = self.make_pg(self.dist.PrefixStore(f"a2a{lo}-{hi}/", self.client()), me, 2)
                wrong = self.a2a_check(pg, me, 2)
                res = {"ok": wrong is None, "init_seconds": round(time.monotonic() - t, 3)}
                if wrong:
                    res["error"] = wrong
                done[p] = (res, pg)
            except Exception as exc:
                done[p] = ({"ok": False, "error": _message(exc), "seconds": round(time.monotonic() - t, 3)}, None)

        threads = {p: threading.Thread(target=connect, args=(p,), daemon=True) for p in peers}
        for th in threads.values():
            th.start()
        deadline = time.monotonic() + timeout_s
        for th in threads.values():
            th.join(max(0.0, deadline - time.monotonic()))
        mesh = {}
        for p in peers:
            res, pg = done.get(p, (None, None))  # a thread still connecting is abandoned (daemon)
            if res is None:
                res = {"ok": False, "error": f"TimeoutError: no all-to-all with rank {p} within {timeout_s} s"}
            mesh[str(p)] = res
            if pg is not None and res["ok"]:
                groups[p] = pg
        self.report["mesh"] = mesh
        for p in peers:
            self.store.set(f"a2a/ok/{r}/{p}", "1" if p in groups else "0")
        self.store.set(f"a2a/all/{r}", "1" if len(groups) == len(peers) else "0")
        sizes, iters = self.spec["sizes"], self.spec["iters"]
        pair_sizes, pair_iters = [sizes[0], sizes[-1]], [iters[0], iters[-1]]
        for rnd in rounds(world):
            p = rnd.get(r)
            if p is None or p not in groups or self.flag(f"a2a/ok/{p}/{r}") != b"1":
                continue
            try:
                mesh[str(p)]["results"] = self.time_op(groups[p], "alltoall", 2, pair_sizes, pair_iters)
            except Exception as exc:
                mesh[str(p)].update(ok=False, error=_message(exc))
        return all(self.flag(f"a2a/all/{i}") == b"1" for i in range(world))

    def flag(self, key):
        """A key another rank sets once its own pairs are settled (at most ``timeout_s`` after the
        mesh began, plus the ranks' skew); None if it never comes."""
        try:
            self.store.wait([key], timedelta(seconds=2 * self.spec["timeout_s"]))
            return self.store.get(key)
        except Exception:
            return None

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
            join = timedelta(seconds=self.join_timeout_s)
            self.store = self.dist.TCPStore(spec["store_host"], spec["store_port"], None, self.rank == 0,
                                            join, wait_for_workers=False)
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
                # The hub pairs once every worker joined or its join window ended: a worker that
                # joined early waits for that (a busy peer's torch start is not this pair's fault).
                self.store.wait(["pairs/start"], timedelta(seconds=self.join_timeout_s + 5))
                self.report["pair"] = self.group(f"pair{self.rank}/", 0, 2)
                go = self.store.get("all/go") == b"1"
            alltoall = bool(spec.get("alltoall"))
            if go and alltoall:
                self.report["stage"] = "mesh"
                go = self.mesh()
            self.report["stage"] = "all"
            if go:
                self.report["all"] = self.group("all/", self.rank, self.world, alltoall=alltoall)
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


def rounds(world):
    """The circle method: world - 1 rounds (world rounds when odd) in which every rank meets one
    other rank at most; every pair meets once. Each round is {rank: partner}."""
    ranks = list(range(world)) + ([None] if world % 2 else [])
    m = len(ranks)
    out = []
    for _ in range(m - 1):
        rnd = {}
        for i in range(m // 2):
            a, b = ranks[i], ranks[m - 1 - i]
            if a is not None and b is not None:
                rnd[a], rnd[b] = b, a
        out.append(rnd)
        ranks = [ranks[0], ranks[-1]] + ranks[1:-1]
    return out


if __name__ == "__main__":
    Job(json.loads(sys.argv[-1])).main()
