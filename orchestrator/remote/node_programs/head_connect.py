"""Connects to host:port (argv 1, 2) until it succeeds or the deadline (argv 3, seconds) passes, each
try bounded by argv 4. "refused" (nothing listening, or a REJECT rule) is retried because the
head's listener may not be up yet; a timeout is what a DROP firewall rule looks like. One JSON
object ``{ok, error}``.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import json
import socket
import sys
import time


def main() -> None:
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


if __name__ == "__main__":
    main()
