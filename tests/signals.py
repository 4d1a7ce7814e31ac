"""Starting a command the way a terminal's foreground job runs, for tests that press Ctrl-C.

A non-interactive shell starts background jobs (``cmd &``, a CI runner's detached job) with
SIGINT ignored, and every descendant inherits that; Python then installs no KeyboardInterrupt
handler, so a SIGINT a test sends is ignored and the test waits out its timeout. Measured here: a
fresh-clone run started in the background failed every Ctrl-C test that way, while the same tests
passed from a terminal. A user's Ctrl-C reaches a foreground job, whose SIGINT is not ignored:
``sigint_default`` (a ``preexec_fn``) gives the child that disposition.
"""

from __future__ import annotations

import signal


def sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
