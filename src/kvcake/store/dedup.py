"""At-most-once execution of mutating master requests: the first outcome of each
``(client, session, seq)`` is kept and replayed to a retry.

A client session sends requests one at a time (``MasterConnection`` holds a lock per call) with
``seq`` increasing by one and ``ack`` = the last ``seq`` it got a reply for, so per session the
table normally holds one reply. Bounds: ``max_sessions`` sessions (least recently used ones are
forgotten first) and ``max_pending`` unacknowledged replies per session (oldest forgotten first).
A forgotten session's very late duplicate would run again: the bounds are sized so that this
needs a client that vanished for longer than thousands of other sessions' lifetimes.

Not thread-safe: :class:`~kvcake.store.master_state.MasterState` calls it under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar, TypeVarTuple

R = TypeVar("R")
Ts = TypeVarTuple("Ts")


class StaleRequest(Exception):
    """A request whose reply the client already acknowledged (a delayed duplicate)."""


class _Session(Generic[R]):
    __slots__ = ("acked", "replies")

    def __init__(self) -> None:
        self.acked = 0
        # seq -> outcome; a plain dict keeps insertion (= seq) order, oldest first
        self.replies: dict[int, R] = {}


class DedupTable(Generic[R]):
    def __init__(self, max_sessions: int = 4096, max_pending: int = 64):
        if max_sessions < 1 or max_pending < 1:
            raise ValueError("dedup bounds must be >= 1")
        self.max_sessions = max_sessions
        self.max_pending = max_pending
        self._sessions: OrderedDict[tuple[str, str], _Session[R]] = OrderedDict()
        self.replays = 0  # duplicates answered from the table (total)
        self.stale = 0  # duplicates refused as already acknowledged (total)

    def lookup(self, client: str, session: str, seq: int, ack: int) -> R | None:
        """The stored outcome of a duplicate, ``None`` for a new request. Prunes acknowledged
        replies; raises :class:`StaleRequest` for ``seq <= ack``."""
        got = self.begin(client, session, seq, ack)
        return got[1]

    def begin(self, client: str, session: str, seq: int, ack: int) -> tuple[_Session[R], R | None]:
        """:meth:`lookup` that also returns the session, for :meth:`finish` (one dict
        lookup per request on the hot path instead of two)."""
        key = (client, session)
        sessions = self._sessions
        s = sessions.get(key)
        if s is None:
            s = sessions[key] = _Session()
            if len(sessions) > self.max_sessions:
                sessions.popitem(last=False)
        else:
            sessions.move_to_end(key)
        if ack > s.acked:
            s.acked = ack
            replies = s.replies
            while replies:  # seqs are recorded in order: drop the acknowledged head
                first = next(iter(replies))
                if first > ack:
                    break
                del replies[first]
        if seq <= s.acked:
            self.stale += 1
            raise StaleRequest(f"request {seq} of session {session} was already acknowledged")
        got = s.replies.get(seq)
        if got is not None:
            self.replays += 1
        return s, got

    def run(
        self, client: str, session: str, seq: int, ack: int, apply: Callable[[*Ts], R], *args: *Ts
    ) -> R:
        """``apply(*args)`` once per ``seq``: :meth:`begin`, then the stored or the new outcome
        (the caller holds the lock that makes this atomic). The common case inline: a known
        session whose ``ack`` acknowledges its one pending reply (every mutating RPC)."""
        key = (client, session)
        s = self._sessions.get(key)
        if s is None or ack < s.acked or seq <= ack:
            s, got = self.begin(client, session, seq, ack)  # new session, stale, pruning
        else:
            self._sessions.move_to_end(key)
            replies = s.replies
            if ack > s.acked:
                s.acked = ack
                while replies:  # seqs are recorded in order: drop the acknowledged head
                    first = next(iter(replies))
                    if first > ack:
                        break
                    del replies[first]
            got = replies.get(seq)
            if got is not None:
                self.replays += 1
        if got is not None:
            return got
        out = apply(*args)
        replies = s.replies
        replies[seq] = out
        if len(replies) > self.max_pending:
            del replies[next(iter(replies))]
        return out

    def finish(self, s: _Session[R], seq: int, outcome: R) -> None:
        replies = s.replies
        replies[seq] = outcome
        if len(replies) > self.max_pending:
            del replies[next(iter(replies))]

    def record(self, client: str, session: str, seq: int, outcome: R) -> None:
        s = self._sessions.get((client, session))
        if s is not None:  # forgotten meanwhile (bounded table): nothing to replay later
            self.finish(s, seq, outcome)

    def forget_client(self, client: str) -> None:
        for key in [k for k in self._sessions if k[0] == client]:
            del self._sessions[key]

    def __len__(self) -> int:
        return sum(len(s.replies) for s in self._sessions.values())

    @property
    def sessions(self) -> int:
        return len(self._sessions)
