"""Listens on host:port (argv 1, 2) on the head while the workers try to connect; exits after argv 4
connections or argv 3 seconds. When the port is already taken (Ray already running there), it
says so and exits: the workers then connect to whatever listens. One JSON object.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import json
import socket
import sys
import time


def main() -> None:
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


if __name__ == "__main__":
    main()
