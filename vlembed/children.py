"""Child processes that do not outlive the process that started them.

``vlembed serve`` starts llama-servers, and ``vlembed index`` (without ``--server``) starts a
``vlembed serve``; both put the child in a session of its own, so that a Ctrl-C in a terminal
reaches the parent alone and the parent stops the child in order. The price is that a parent
killed outright (SIGKILL, the OOM killer) left the child running, holding its port, memory and
CPU threads for good. Linux's parent-death signal closes that gap: the child is sent a signal
when the thread that started it ends. It is set through util-linux's ``setpriv`` (present
wherever util-linux is, which Debian and Ubuntu treat as essential), which sets it and then
execs the command, so the pid is the command's own; it cannot be set from Python between fork
and exec without ``preexec_fn``, which is unsafe in a threaded process.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence

__all__ = ["dying_with_parent"]


def dying_with_parent(argv: Sequence[str], signal_name: str = "KILL") -> list[str]:
    """``argv`` prefixed so that its process gets SIGsignal_name when this thread ends.

    Unchanged where there is no parent-death signal (not Linux, or no ``setpriv``). Start the
    child from a thread that lives as long as the child should (the main thread, an event
    loop's thread).
    """
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", signal_name, "--", *argv]
