"""The size of /dev/shm (argv[1]) and the free space of the folder that holds argv[2] (its first
existing ancestor): one JSON object, parsed by ``nodes.probes``.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import json
import os
import sys
from typing import Any


def main() -> None:
    shm, path = sys.argv[1], sys.argv[2]
    out: dict[str, Any] = {"shm_bytes": None, "disk_free_bytes": None, "disk_path": None}
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


if __name__ == "__main__":
    main()
