"""Prints a TCP port that is free on this node right now (the kernel's pick), for the rendezvous of
the collective check (``collective/plan.py``, ``free_port_argv``).

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import socket


def main() -> None:
    s = socket.socket()
    s.bind(("", 0))
    print(s.getsockname()[1])


if __name__ == "__main__":
    main()
