"""The InfiniBand devices and ports under /sys/class/infiniband (or argv[1]): one JSON object
``{device: {port: {state, phys_state, rate, link_layer}}}``, parsed by ``nodes.probes.parse_ib_sysfs``.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import json
import os
import sys


def main() -> None:
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


if __name__ == "__main__":
    main()
