"""The heartbeat thread outlives a failed round: a remount that raises something other than a
kvcake error (an OSError of a directory publish) must not end the client's only way back into
a master that forgot it. A stub connection (pure logic of :class:`Heartbeater`)."""

from __future__ import annotations

import threading
import time

from kvcake.store import protocol as P
from kvcake.store.liveness import Heartbeater


class ForgetfulMaster:
    """Answers every heartbeat with "unknown client" (count 1)."""

    def __init__(self) -> None:
        self.calls = 0

    def call(self, msg: object) -> P.Reply:
        self.calls += 1
        return P.Reply(count=1)

    def close(self) -> None:
        pass


def test_a_remount_that_raises_does_not_end_the_heartbeat() -> None:
    attempts: list[float] = []
    done = threading.Event()

    def remount() -> None:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            raise OSError("directory connection reset")  # not a KvcakeError
        done.set()

    hb = Heartbeater(ForgetfulMaster(), "c1", "127.0.0.1", 0.06, [remount])  # type: ignore[arg-type]
    hb.start()
    try:
        assert done.wait(5), "the heartbeat thread died with the first remount's error"
        assert len(attempts) >= 2 and hb._thread.is_alive()
    finally:
        hb.stop()
