"""What a command started in a pseudo-terminal needs to behave as at a person's terminal."""

from __future__ import annotations

import signal


def as_at_a_terminal() -> None:
    """A ``preexec_fn`` for a child: Ctrl-C and Ctrl-\\ do what they do at a terminal. A test
    process started in the background by a non-interactive shell (``nohup pytest &``, as a CI
    script may) ignores SIGINT; a child inherits that, and Python then installs no
    KeyboardInterrupt handler at all, so Ctrl-C would do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
