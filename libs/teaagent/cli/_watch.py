"""What the asking side's command line shows while a quorum is awaited (``tools call``, ``run``).

:class:`QuorumWatch` is the quorum gate's ``on_wait`` callback. It writes, in the words every
surface shares (:func:`teaagent.relay_client.describe_wait` and :func:`~teaagent.relay_client.wait_news`):

- when the request is sent: the count, who received it, the time left, and the command a peer's
  operator runs to approve it;
- one line per change: a peer's relay received it or could not be reached, a peer approved or
  denied (its key's fingerprint, the time since asking);
- at the reminder marks of the time left (from the local clock), the wait again, with that command;
- on expiry, why: who received the request and never answered, and who was never reached.

The signers and deniers shown are the ones whose signed decisions verify on this node.
"""

from __future__ import annotations

from collections.abc import Callable

from teaagent.relay_client import WaitProgress, describe_wait, expiry_sentence, wait_news

__all__ = ["QuorumWatch", "expiry_sentence"]


class QuorumWatch:
    """Writes a quorum wait's lines (the gate's ``on_wait``)."""

    def __init__(self, write: Callable[[str], None]) -> None:
        """Args:
        write: Called with each line (no newline), such as a command line's stderr writer.
        """
        self._write = write
        self._last: dict[str, WaitProgress] = {}

    def __call__(self, progress: WaitProgress) -> None:
        before = self._last.get(progress.request_id)
        self._last[progress.request_id] = progress
        for line in wait_news(before, progress):
            self._write(line)
        if progress.why in ("sent", "reminder") and progress.waiting:
            self._write(describe_wait(progress))
        elif progress.why == "decided" and progress.state == "expired":
            self._write(expiry_sentence(progress))
