"""Giving up on a read that writes into caller memory (``Client.batch_get_into_ranges``).

The vLLM connector reads pooled blocks straight into vLLM's KV rows under a deadline; past it
vLLM recomputes those blocks, so no late byte may land there. The guard makes that a lock
instead of a hope.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from kvcake.core import native
from kvcake.core.native import StopFlag
from kvcake.store.errors import TransferFailed


class ReadGuard:
    """Lets a caller give up on a ranges read and reuse its buffers at once. Bytes reach the
    caller's buffers only inside :meth:`commit`: memory copies, or a network receive of bytes
    already arriving (``transfer.scatter``, which polls :attr:`stop` every <= 10 ms and never
    waits on a peer past it). Several commits may run at once (one per connection of a
    striped read); :meth:`cancel` sets the stop flag, refuses new commits and waits for the
    running ones, so once it returns no byte can arrive any more, even from a read still in
    flight. It is a ``transfer.scatter.Gate``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0  # commits running
        self.cancelled = False
        # read by a native copy or receive in progress (core.native), without the GIL
        self.stop = StopFlag() if native.AVAILABLE else None

    def cancel(self) -> None:
        """Once this returns, no byte reaches the caller's buffers any more. It waits for the
        copies and receives in progress, which the stop flag ends at their next chunk
        boundary (<= 1 MiB) or poll slice (<= 10 ms)."""
        if self.stop is not None:
            self.stop.set()
        with self._cond:
            self.cancelled = True
            while self._active:
                self._cond.wait()

    @contextlib.contextmanager
    def commit(self) -> Iterator[None]:
        with self._cond:
            if self.cancelled:
                raise TransferFailed("read cancelled")
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if not self._active:
                    self._cond.notify_all()


def commit_under(guard: ReadGuard | None) -> contextlib.AbstractContextManager[None]:
    return guard.commit() if guard is not None else contextlib.nullcontext()
