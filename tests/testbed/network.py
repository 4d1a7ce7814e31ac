"""Network plumbing of the test bed: subnets, bridges, network namespaces, veth pairs, nft rules.

Does I/O: runs ``ip`` and ``nft`` (needs root). Names are derived from the run id so that
several test beds (other test sessions on the same machine) never touch each other's objects:
bridge ``orchtb<run>`` (and ``orchtb<run>i`` for the ``ib0`` network), namespaces
``orchtb-<run>-<i>``, root-side veth ends ``otb<run><i>e`` / ``otb<run><i>i``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PREFIX = "orchtb"
CLAIMS_DIR = Path("/run/orchtb-claims")


class NetError(RuntimeError):
    """An ``ip``/``nft`` command failed; the message carries its argv and stderr."""


def sh(argv: Sequence[str], check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, input=input)
    if check and proc.returncode != 0:
        raise NetError(f"`{' '.join(argv)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


@dataclass(frozen=True)
class Subnets:
    """Two /24 networks for one run: ``eth`` (the ssh/Ray network) and ``ib`` (the ib0 network)."""

    eth: ipaddress.IPv4Network
    ib: ipaddress.IPv4Network

    def gateway(self) -> str:
        return str(self.eth.network_address + 1)

    def host_address(self, index: int) -> str:
        return str(self.eth.network_address + 10 + index)

    def ib_gateway(self) -> str:
        return str(self.ib.network_address + 1)

    def ib_address(self, index: int) -> str:
        return str(self.ib.network_address + 10 + index)


def _used_networks() -> list[ipaddress.IPv4Network]:
    used = []
    out = sh(["ip", "-j", "-4", "route", "show", "table", "all"], check=False).stdout or "[]"
    for route in json.loads(out):
        dst = route.get("dst", "")
        if dst and dst != "default" and "." in dst:
            try:
                used.append(ipaddress.ip_network(dst if "/" in dst else dst + "/32", strict=False))
            except ValueError:
                pass
    return used


def claim_subnets(run_id: str, rng: random.Random | None = None) -> Subnets:
    """Pick a free pair of 10.X.Y.0/24 networks and claim it (a file per claim, created with
    O_EXCL so two test beds starting at the same moment cannot pick the same one)."""
    rng = rng or random.Random()
    CLAIMS_DIR.mkdir(parents=True, exist_ok=True)
    used = _used_networks()
    for _ in range(200):
        x, y = rng.randint(64, 250), rng.randrange(0, 254, 2)
        eth = ipaddress.ip_network(f"10.{x}.{y}.0/24")
        ib = ipaddress.ip_network(f"10.{x}.{y + 1}.0/24")
        if any(eth.overlaps(u) or ib.overlaps(u) for u in used):
            continue
        claim = CLAIMS_DIR / f"10.{x}.{y}"
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            f.write(run_id + "\n")
        return Subnets(eth, ib)
    raise NetError("no free 10.x.y.0/24 pair found for the test bed")


def release_subnets(run_id: str) -> None:
    if not CLAIMS_DIR.is_dir():
        return
    for claim in CLAIMS_DIR.iterdir():
        try:
            if claim.read_text().strip() == run_id:
                claim.unlink()
        except OSError:
            pass


def bridge_name(run_id: str, ib: bool = False) -> str:
    return f"{PREFIX}{run_id}" + ("i" if ib else "")


def netns_name(run_id: str, index: int) -> str:
    return f"{PREFIX}-{run_id}-{index}"


def veth_name(run_id: str, index: int, ib: bool = False) -> str:
    return f"otb{run_id}{index}" + ("i" if ib else "e")


def create_bridge(run_id: str, subnets: Subnets, ib: bool = False) -> None:
    br = bridge_name(run_id, ib)
    net = subnets.ib if ib else subnets.eth
    gw = subnets.ib_gateway() if ib else subnets.gateway()
    sh(["ip", "link", "add", br, "type", "bridge"])
    sh(["ip", "addr", "add", f"{gw}/{net.prefixlen}", "dev", br])
    sh(["ip", "link", "set", br, "up"])


def create_host_netns(run_id: str, index: int, subnets: Subnets, with_ib: bool) -> str:
    """Create the namespace of host ``index`` with ``lo`` up, ``eth0`` on the run's bridge and,
    when asked, ``ib0`` on the run's second bridge. Returns the namespace name."""
    ns = netns_name(run_id, index)
    sh(["ip", "netns", "add", ns])
    sh(["ip", "-n", ns, "link", "set", "lo", "up"])
    nics = [("eth0", False)] + ([("ib0", True)] if with_ib else [])
    for inner, ib in nics:
        outer = veth_name(run_id, index, ib)
        net = subnets.ib if ib else subnets.eth
        addr = subnets.ib_address(index) if ib else subnets.host_address(index)
        sh(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner, "netns", ns])
        sh(["ip", "link", "set", outer, "master", bridge_name(run_id, ib), "up"])
        sh(["ip", "-n", ns, "addr", "add", f"{addr}/{net.prefixlen}", "dev", inner])
        sh(["ip", "-n", ns, "link", "set", inner, "up"])
    return ns


def delete_netns(ns: str) -> None:
    sh(["ip", "netns", "del", ns], check=False)
    etc = Path("/etc/netns") / ns
    if etc.is_dir():
        for p in sorted(etc.rglob("*"), reverse=True):
            p.unlink() if not p.is_dir() else p.rmdir()
        etc.rmdir()


def delete_link(name: str) -> None:
    sh(["ip", "link", "del", name], check=False)


def list_netns(prefix: str) -> list[str]:
    out = sh(["ip", "-j", "netns", "list"], check=False).stdout.strip() or "[]"
    return [n["name"] for n in json.loads(out) if n.get("name", "").startswith(prefix)]


def list_links(prefix: str) -> list[str]:
    out = sh(["ip", "-j", "link", "show"], check=False).stdout.strip() or "[]"
    return [n["ifname"] for n in json.loads(out) if n.get("ifname", "").startswith(prefix)]


# --- faults (nft inside a host's namespace; stack notes: tc netem is not available) ---------

# The alias of an interface a fault added (``add_unroutable_nic``): ``clear_faults`` deletes those.
_FAULT_ALIAS = "orchtb-fault"
_TABLE = "orchtb"


def _nft(ns: str, *args: str, input: str | None = None) -> None:
    sh(["ip", "netns", "exec", ns, "nft", *args], input=input)


def _ensure_table(ns: str) -> None:
    _nft(
        ns,
        "-f",
        "-",
        input=(
            f"table inet {_TABLE} {{\n"
            "  chain out { type filter hook output priority 0; }\n"
            "  chain in { type filter hook input priority 0; }\n"
            "}\n"
        ),
    )


def block_port(ns: str, dst_addr: str, port: int) -> None:
    """Drop the host's outgoing TCP packets to ``dst_addr:port`` (a connect then times out)."""
    _ensure_table(ns)
    _nft(ns, "add", "rule", "inet", _TABLE, "out", "ip", "daddr", dst_addr, "tcp", "dport", str(port), "drop")


def block_peer(ns: str, dst_addr: str) -> None:
    """Drop the host's outgoing TCP to ``dst_addr`` on every port: its connects to that peer time
    out, and so do its answers to that peer's connects (a pair of hosts that cannot talk while
    both still reach everyone else)."""
    _ensure_table(ns)
    _nft(ns, "add", "rule", "inet", _TABLE, "out", "ip", "daddr", dst_addr, "ip", "protocol", "tcp", "drop")


def throttle_peer(ns: str, dst_addr: str, kbytes_per_s: int) -> None:
    """Drop the host's outgoing packets to ``dst_addr`` above ``kbytes_per_s``: TCP to that peer
    backs off far below the link (a congested or shaped path; tc/netem is not available here)."""
    _ensure_table(ns)
    _nft(ns, "add", "rule", "inet", _TABLE, "out", "ip", "daddr", dst_addr, "limit", "rate", "over",
         f"{kbytes_per_s}", "kbytes/second", "drop")  # fmt: skip


def block_all_but(ns: str, dst_addr: str, port: int) -> None:
    """Drop the host's outgoing TCP to ``dst_addr`` on every port but ``port`` (a firewall that
    opens only Ray's port): connects elsewhere time out, and so do the host's answers to
    connections from ``dst_addr``."""
    _ensure_table(ns)
    _nft(ns, "add", "rule", "inet", _TABLE, "out", "ip", "daddr", dst_addr, "tcp", "dport", "!=", str(port), "drop")


def add_unroutable_nic(ns: str, name: str, cidr: str) -> None:
    """Give the host an interface ``name`` (up, with ``cidr`` on it, so preflight's interface
    checks pass) whose address no peer can reach: a veth pair inside the host, the address
    without a prefix route, ARP answered only for addresses on the interface asked
    (arp_ignore=1), and no packet from or to that address crossing the host's other interfaces
    (as for an address that exists only inside the host, e.g. a container's). ``clear_faults``
    removes it."""
    peer = f"{name}p"
    addr = cidr.split("/")[0]
    for argv in (["ip", "link", "add", name, "type", "veth", "peer", "name", peer], ["ip", "link", "set", name, "up"],
                 ["ip", "link", "set", peer, "up"], ["ip", "link", "set", name, "alias", _FAULT_ALIAS],
                 ["ip", "addr", "add", cidr, "dev", name, "noprefixroute"],
                 ["sysctl", "-q", "-w", "net.ipv4.conf.all.arp_ignore=1"]):  # fmt: skip
        sh(["ip", "netns", "exec", ns, *argv])
    _ensure_table(ns)
    _nft(ns, "add", "rule", "inet", _TABLE, "out", "oifname", "!=", name, "ip", "saddr", addr, "drop")
    _nft(ns, "add", "rule", "inet", _TABLE, "in", "iifname", "!=", name, "ip", "daddr", addr, "drop")


def drop_all(ns: str) -> None:
    """Drop every packet into and out of the host's eth0/ib0 (loopback keeps working): the host
    is as if unplugged; a connect to it times out."""
    _ensure_table(ns)
    for chain, direction in (("in", "iifname"), ("out", "oifname")):
        _nft(ns, "add", "rule", "inet", _TABLE, chain, direction, "!=", "lo", "drop")


def drop_interface(ns: str, ifname: str) -> None:
    """Drop every packet into and out of one of the host's interfaces (``ib0``): that network is
    as if cut while the others keep working."""
    _ensure_table(ns)
    for chain, direction in (("in", "iifname"), ("out", "oifname")):
        _nft(ns, "add", "rule", "inet", _TABLE, chain, direction, ifname, "counter", "drop")


def dropped_packets(ns: str, ifname: str) -> int:
    """Packets the ``drop_interface`` rules of ``ifname`` dropped so far (in + out)."""
    out = sh(["ip", "netns", "exec", ns, "nft", "-j", "list", "table", "inet", _TABLE], check=False).stdout or "{}"
    total = 0
    for item in json.loads(out).get("nftables", []):
        rule = item.get("rule")
        if not rule:
            continue
        exprs = rule.get("expr", [])
        names = [e["match"]["right"] for e in exprs if "match" in e and isinstance(e["match"].get("right"), str)]
        if ifname in names:
            total += sum(e["counter"]["packets"] for e in exprs if "counter" in e)
    return total


def clear_faults(ns: str) -> None:
    """Undo every fault of this module on the host: the drop rules, the interfaces a fault added
    (and their ARP setting), so the next test starts from the host as it was made."""
    sh(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", _TABLE], check=False)
    links = json.loads(sh(["ip", "netns", "exec", ns, "ip", "-j", "link", "show"]).stdout or "[]")
    added = [ln["ifname"] for ln in links if ln.get("ifalias") == _FAULT_ALIAS]
    for name in added:
        sh(["ip", "netns", "exec", ns, "ip", "link", "del", name], check=False)  # its veth peer goes with it
    if added:
        sh(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.conf.all.arp_ignore=0"])
