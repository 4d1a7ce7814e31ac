"""Creates the directory argv[1] 0700, owned by the invoking user, or accepts an existing one only
when it is a real directory (not a symlink) of that user, then makes it 0700: a directory planted
by someone else (a shared /tmp) is refused, never used.

Runs on the node with its python (``node_programs``: stdlib only, shipped whole as
``python -c SOURCE ARGS``); orch's own code never imports it.
"""

import os
import stat
import sys


def main() -> None:
    path = sys.argv[1]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        sys.exit(f"{path} exists and is not a directory of uid {os.getuid()}: refusing to use it")
    os.chmod(path, 0o700)


if __name__ == "__main__":
    main()
