"""The multi-host test bed: N hosts on this machine, each with its own address, sshd, host key,
GPUs (stand-in nvidia-smi), NICs, /dev/shm and Python path.

Does I/O (root): network namespaces, a bridge, veth pairs, one pid+mount namespace per host
(init: ``hostinit.py``), one sshd per host, files under ``/var/tmp/orchtb/<run>/``.
Teardown (``Testbed.close``) is idempotent and also reachable from ``atexit`` and from
``cleanup_stale()`` for runs whose owning process died.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.testbed import gpus, network, sshd
from tests.testbed.runs import BASE_DIR, kill_host, proc_start_time, remove_network

HOSTINIT = Path(__file__).with_name("hostinit.py")
VLLM_GPU_STANDIN = Path(__file__).with_name("vllm_gpu_standin")
HOST_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable


@dataclass(frozen=True)
class HostSpec:
    """What one test host is. ``gpus``: a profile of ``gpus.parse_profile`` ("8xH100-80GB",
    "4xA100-40GB", "none", "mig", "broken"). ``nics``: extra NICs, only "ib0" (a second network
    shared by the hosts that have one). ``shm_size``: size of the host's own /dev/shm ("1g";
    None: the machine's). ``pythonpath``: dirs put first on the host's PYTHONPATH.
    ``versions``: distribution -> version really installed for this host (``pip install
    --no-deps --target``, cached under ~/.cache/orch/testbed) and put first on its PYTHONPATH:
    ``import ray`` and ``importlib.metadata`` both give that version there.
    ``expected_gpus``: the node's ``gpus`` in ``manifest_yaml`` (default: what it has, min 1).
    ``vllm_gpu``: every Python process of the host carries the vLLM device-key stand-in
    (``tests/testbed/vllm_gpu_standin/sitecustomize.py``): vLLM's CPU build then runs the Ray
    executor, the GPU layout of `orch rollout`, over the host's described (logical) GPUs."""

    gpus: str = "8xH100-80GB"
    name: str | None = None
    nics: tuple[str, ...] = ()
    shm_size: str | None = None
    pythonpath: tuple[str, ...] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    ssh_port: int = 22
    expected_gpus: int | None = None
    vllm_gpu: bool = False


@dataclass
class TestHost:
    """One running host. ``address`` is reachable from this machine's namespace."""

    __test__ = False  # not a pytest test class

    name: str
    index: int
    spec: HostSpec
    profile: gpus.GpuProfile
    address: str
    ssh_port: int
    netns: str
    dir: Path
    ib_address: str | None = None
    init_pid: int | None = None
    _unshare: subprocess.Popen | None = None
    _sshd: subprocess.Popen | None = None

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def sshd_log(self) -> Path:
        return self.dir / "sshd.log"

    @property
    def ray_dir(self) -> Path:
        """The host's private Ray temp dir as seen from this machine's namespace."""
        return self.dir / "ray"

    @property
    def ns_exec(self) -> list[str]:
        """argv prefix that runs a command inside this host (its network, mount, pid namespaces)."""
        return ["nsenter", "-t", str(self.init_pid), "-n", "-m", "-p", "--"]

    def known_hosts_name(self) -> str:
        return self.address if self.ssh_port == 22 else f"[{self.address}]:{self.ssh_port}"

    def host_key_line(self) -> str:
        kind, b64 = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()[:2]
        return f"{self.known_hosts_name()} {kind} {b64}"


class Testbed:
    """A set of running test hosts. Use as a context manager or call ``close()``."""

    __test__ = False

    def __init__(self, specs: Sequence[HostSpec], name: str | None = None, manual: bool = False) -> None:
        self.run_id = uuid.uuid4().hex[:6]
        self.name = name or f"tb-{self.run_id}"
        self.dir = BASE_DIR / self.run_id
        self.hosts: list[TestHost] = []
        self._closed = False
        self.manual = manual  # outlives this process (scripts/testbed.py up); torn down by `down`
        self._lock = threading.Lock()
        self._specs = list(specs)
        names = [s.name or f"host{i}" for i, s in enumerate(self._specs)]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate host names: {names}")
        self._names = names

    # --- paths -------------------------------------------------------------------------
    @property
    def identity_file(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """known_hosts holding every host's key (tests of first contact use their own file)."""
        return self.dir / "known_hosts"

    @property
    def ray_temp_dir(self) -> Path:
        """One path, private per host: each host bind-mounts its own ``ray_dir`` here."""
        return self.dir / "ray"

    def host(self, name: str) -> TestHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no test host {name!r} in {[h.name for h in self.hosts]}")

    def _h(self, host: TestHost | str) -> TestHost:
        return self.host(host) if isinstance(host, str) else host

    # --- bring-up ----------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Testbed:
        self.dir.mkdir(parents=True)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation dir
        self._write_owner()
        if not self.manual:
            atexit.register(self.close)
        try:
            self.subnets = network.claim_subnets(self.run_id)
            network.create_bridge(self.run_id, self.subnets)
            if any("ib0" in s.nics for s in self._specs):
                network.create_bridge(self.run_id, self.subnets, ib=True)
            self.ray_temp_dir.mkdir()
            sshd.keygen(self.identity_file, f"orchtb-{self.run_id}")
            (self.dir / "authorized_keys").write_text(Path(str(self.identity_file) + ".pub").read_text())
            for i, (spec, hname) in enumerate(zip(self._specs, self._names)):
                bad = set(spec.nics) - {"ib0"}
                if bad:
                    raise ValueError(f"unsupported NICs {sorted(bad)}: only 'ib0'")
                self.hosts.append(
                    TestHost(
                        name=hname,
                        index=i,
                        spec=spec,
                        profile=gpus.parse_profile(spec.gpus),
                        address=self.subnets.host_address(i),
                        ssh_port=spec.ssh_port,
                        netns=network.netns_name(self.run_id, i),
                        dir=self.dir / "hosts" / hname,
                        ib_address=self.subnets.ib_address(i) if "ib0" in spec.nics else None,
                    )
                )
            with ThreadPoolExecutor(max_workers=min(16, len(self.hosts) or 1)) as pool:
                list(pool.map(self._start_host, self.hosts))
            self._write_owner()
            self.known_hosts.write_text("".join(h.host_key_line() + "\n" for h in self.hosts))
            deadline = time.monotonic() + timeout
            for h in self.hosts:
                sshd.wait_port(h.address, h.ssh_port, max(1.0, deadline - time.monotonic()), h._sshd, h.sshd_log)
        except BaseException:
            self.close()
            raise
        return self

    def _start_host(self, h: TestHost) -> None:
        (h.dir / "site").mkdir(parents=True)
        h.ray_dir.mkdir()
        network.create_host_netns(self.run_id, h.index, self.subnets, with_ib=h.ib_address is not None)
        gpus.install(h.profile, h.bin_dir, f"{self.run_id}/{h.name}")
        installed = [str(real_install(dist, version)) for dist, version in h.spec.versions.items()]
        sshd.keygen(h.host_key, f"orchtb-{self.run_id}-{h.name}")
        standin = [str(VLLM_GPU_STANDIN)] if h.spec.vllm_gpu else []
        pythonpath = standin + list(h.spec.pythonpath) + installed
        h.sshd_config.write_text(
            sshd.render_config(
                host_dir=h.dir,
                port=h.ssh_port,
                host_key=h.host_key,
                authorized_keys=self.dir / "authorized_keys",
                bin_dir=h.bin_dir,
                pythonpath=pythonpath,
            )
        )
        argv = ["ip", "netns", "exec", h.netns, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        argv += [HOST_PYTHON, "-I", "-S", str(HOSTINIT), "--bind", str(h.ray_dir), str(self.ray_temp_dir)]
        if Path("/root/.bashrc").exists():
            # sshd runs commands with `bash -c`, which sources root's ~/.bashrc on Debian; this
            # machine's one (pyenv init) costs ~0.5 s per command. A test host is a clean machine.
            (self.dir / "empty-bashrc").touch()
            argv += ["--bind", str(self.dir / "empty-bashrc"), "/root/.bashrc"]
        if h.spec.shm_size:
            argv += ["--shm", h.spec.shm_size]
        h._unshare = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=open(h.dir / "init.log", "ab"),
            start_new_session=True,
        )
        ready, _, _ = select.select([h._unshare.stdout], [], [], 15)
        line = h._unshare.stdout.readline().strip() if ready else b""
        if line != b"ready":
            raise RuntimeError(f"host {h.name}: init did not start: {(h.dir / 'init.log').read_text()[-1000:]}")
        kids = sshd.children(h._unshare.pid)
        if not kids:
            raise RuntimeError(f"host {h.name}: init process not found")
        h.init_pid = kids[0]
        h._sshd = sshd.start(h.init_pid, h.sshd_config, h.sshd_log)

    def _write_owner(self) -> None:
        owner = {
            "pid": os.getpid(),
            "start": proc_start_time(os.getpid()),
            "manual": self.manual,
            "name": self.name,
            "unshare_pids": [h._unshare.pid for h in self.hosts if h._unshare],
            "hosts": [
                {"name": h.name, "address": h.address, "ssh_port": h.ssh_port, "netns": h.netns,
                 "init_pid": h.init_pid, "gpus": h.spec.gpus}
                for h in self.hosts
            ],
        }
        tmp = self.dir / "owner.json.tmp"
        tmp.write_text(json.dumps(owner))
        tmp.replace(self.dir / "owner.json")  # readers never see half a record

    # --- controls used by tests --------------------------------------------------------
    def stop_sshd(self, host: TestHost | str) -> None:
        """Stop the host's sshd (its other processes keep running): connects are refused."""
        sshd.stop(self._h(host)._sshd)

    def start_sshd(self, host: TestHost | str, timeout: float = 10.0) -> None:
        h = self._h(host)
        sshd.stop(h._sshd)
        h._sshd = sshd.start(h.init_pid, h.sshd_config, h.sshd_log)  # type: ignore[arg-type]
        sshd.wait_port(h.address, h.ssh_port, timeout, h._sshd, h.sshd_log)

    def regenerate_host_key(self, host: TestHost | str) -> None:
        """Give the host a new host key and restart its sshd (``known_hosts`` keeps the old one)."""
        h = self._h(host)
        sshd.keygen(h.host_key, f"orchtb-{self.run_id}-{h.name}-regenerated")
        self.start_sshd(h)

    def ns_exec(self, host: TestHost | str, argv: Sequence[str], check: bool = True, timeout: float = 60):
        """Run argv inside the host (as root, not over SSH); returns CompletedProcess (text)."""
        h = self._h(host)
        return subprocess.run(h.ns_exec + list(argv), capture_output=True, text=True, check=check, timeout=timeout)

    def block_port(self, host: TestHost | str, dst_addr: str, port: int) -> None:
        """Drop the host's outgoing TCP packets to dst_addr:port (a connect then times out)."""
        network.block_port(self._h(host).netns, dst_addr, port)

    def block_peer(self, host: TestHost | str, dst_addr: str) -> None:
        """Drop the host's outgoing TCP to dst_addr on every port (see network.block_peer)."""
        network.block_peer(self._h(host).netns, dst_addr)

    def throttle_peer(self, host: TestHost | str, dst_addr: str, kbytes_per_s: int) -> None:
        """Drop the host's packets to dst_addr above a rate (see network.throttle_peer)."""
        network.throttle_peer(self._h(host).netns, dst_addr, kbytes_per_s)

    def block_all_but(self, host: TestHost | str, dst_addr: str, port: int) -> None:
        """Drop the host's outgoing TCP to dst_addr except to ``port`` (see network.block_all_but)."""
        network.block_all_but(self._h(host).netns, dst_addr, port)

    def add_unroutable_nic(self, host: TestHost | str, name: str, cidr: str) -> None:
        """An interface that passes preflight but that no peer can reach (network.add_unroutable_nic)."""
        network.add_unroutable_nic(self._h(host).netns, name, cidr)

    def drop_all(self, host: TestHost | str) -> None:
        """Drop every packet to and from the host on eth0/ib0: it is as if unplugged."""
        network.drop_all(self._h(host).netns)

    def drop_interface(self, host: TestHost | str, ifname: str) -> None:
        """Drop every packet on one interface of the host (``ib0``); the others keep working."""
        network.drop_interface(self._h(host).netns, ifname)

    def dropped_packets(self, host: TestHost | str, ifname: str) -> int:
        return network.dropped_packets(self._h(host).netns, ifname)

    def clear_faults(self, host: TestHost | str) -> None:
        network.clear_faults(self._h(host).netns)

    # --- manifest ----------------------------------------------------------------------
    def manifest_dict(
        self,
        name: str | None = None,
        head: str | None = None,
        accelerator: str = "gpu",
        node_overrides: Mapping[str, Mapping] | None = None,
        **overrides,
    ) -> dict:
        """A cluster.yaml (as a dict) for these hosts. ``head``: the head's name (default: the
        first host); ``node_overrides``: per node name, keys merged into that node;
        other keyword arguments are merged (recursively for mappings) into the top level."""
        head = head or self.hosts[0].name
        nodes = []
        for h in self.hosts:
            node: dict = {"name": h.name, "host": h.address, "role": "head" if h.name == head else "worker"}
            if h.ssh_port != 22:
                node["port"] = h.ssh_port
            if accelerator == "cpu":
                node["gpus"] = 0
            else:
                node["gpus"] = h.spec.expected_gpus or max(1, h.profile.count)
                if h.profile.model:
                    node["gpu_type"] = h.profile.model
            node.update((node_overrides or {}).get(h.name, {}))
            nodes.append(node)
        doc = {
            "name": name or self.name,
            "accelerator": accelerator,
            "python": sys.executable,
            "ssh": {
                "user": "root",
                "identity_file": str(self.identity_file),
                "known_hosts": str(self.known_hosts),
                "connect_timeout": 5,
            },
            "ray": {"temp_dir": str(self.ray_temp_dir)},
            "nodes": nodes,
        }
        return _merge(doc, overrides)

    def manifest_yaml(self, **kwargs) -> str:
        return yaml.safe_dump(self.manifest_dict(**kwargs), sort_keys=False)

    def write_manifest(self, path: Path | None = None, **kwargs) -> Path:
        path = path or self.dir / "cluster.yaml"
        path.write_text(self.manifest_yaml(**kwargs))
        return path

    # --- teardown ----------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for h in self.hosts:
            sshd.stop(h._sshd)
            kill_host(h.init_pid, h._unshare.pid if h._unshare else None)
            if h._unshare is not None:
                try:
                    h._unshare.wait(5)
                except subprocess.TimeoutExpired:
                    h._unshare.kill()
                if h._unshare.stdout:
                    h._unshare.stdout.close()
        remove_network(self.run_id)
        if os.environ.get("ORCHTB_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def check_capabilities() -> str | None:
    """Why the test bed cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "the multi-host test bed needs root (network namespaces, sshd)"
    for tool in ("ip", "unshare", "nsenter", "ssh-keygen", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (apt-get install iproute2 util-linux openssh-client nftables)"
    if not os.access(sshd.SSHD, os.X_OK):
        return f"{sshd.SSHD} not found (apt-get install openssh-server)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation dir
    return None


def real_install(dist: str, version: str) -> Path:
    """A real install of ``dist==version`` (no dependencies) in a cached folder, made once.

    A host that carries another version of a package gets the package itself, not a stand-in:
    the wheel comes from the package index the first time (ray 2.59.0: 79 MB, a few seconds).
    """
    import fcntl

    base = Path(os.environ.get("ORCH_TESTBED_CACHE") or Path.home() / ".cache" / "orch" / "testbed")
    target = base / f"site-{dist}-{version}"
    done = target / ".orch-installed"
    if done.exists():
        return target
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".lock-{dist}-{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent test sessions install it once
        if not done.exists():
            tmp = base / f".tmp-{dist}-{version}-{os.getpid()}"
            argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
                    "--disable-pip-version-check", "--target", str(tmp), f"{dist}=={version}"]  # fmt: skip
            out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise RuntimeError(f"could not install {dist}=={version} for a test host: {out.stderr[-2000:]}")
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
            done.write_text(f"{dist}=={version}\n")
    return target
