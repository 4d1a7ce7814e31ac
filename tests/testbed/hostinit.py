"""PID 1 of one test host (run inside its network, pid and mount namespaces).

Started by the test bed as
``ip netns exec NS unshare --pid --fork --mount-proc python -I -S hostinit.py [--shm SIZE]
[--bind SRC DST]...``. It mounts what makes the host its own (a /dev/shm of its own size, a
private Ray temp dir), prints ``ready`` and then only reaps orphans, as an init must. When it
dies the kernel kills every process of the host (its sshd, its Ray), which is how teardown and
``ray stop`` stay confined to one host. Stdlib only: it runs before anything else.
"""

import os
import signal
import subprocess
import sys
import time


def main(argv):
    args = list(argv)
    while args:
        opt = args.pop(0)
        if opt == "--shm":
            size = args.pop(0)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "orchtb-shm", "/dev/shm"], check=True)
        elif opt == "--bind":
            src, dst = args.pop(0), args.pop(0)
            subprocess.run(["mount", "--bind", src, dst], check=True)
        else:
            print("hostinit: unknown option " + opt, file=sys.stderr, flush=True)
            return 2
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    print("ready", flush=True)
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.5)  # no children right now; orphans may be re-parented to us later
        except InterruptedError:
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
