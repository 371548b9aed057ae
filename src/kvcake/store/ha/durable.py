"""A master whose acknowledged mutations are durable: each mutating request is applied, its
changes are appended to the operation log, and the reply waits until the log has them.

Built on the plain :class:`~kvcake.store.master_server.Master` through two narrow seams: its
``state_factory`` (a :class:`JournaledState` rebuilt from the log by :func:`build_state`) and
a wrapper around its handlers' ``dispatch``. A log that fails (fenced by a new leader, storage gone) turns
every later mutating reply into ``RpcFailed`` (-900; clients retry elsewhere) and calls
``on_failure`` so the owner can step down.
"""

from __future__ import annotations

import logging
import time

import msgspec

from kvcake.store import protocol as P
from kvcake.store.config import MasterConfig
from kvcake.store.deferred_reply import DeferredReply, ReplySender
from kvcake.store.errors import RPC_FAIL
from kvcake.store.ha.journal import JournaledState
from kvcake.store.ha.oplog import LogFailed, OpLog
from kvcake.store.ha.replay import build_state
from kvcake.store.ha.view import FenceRec, View
from kvcake.store.liveness import inherited_grace_s
from kvcake.store.master_server import Master

log = logging.getLogger(__name__)

# Requests whose effects must be durable before their reply (reads, heartbeats and task polls
# change nothing the log records).
MUTATING: frozenset[type] = frozenset(
    (
        P.Mount,
        P.Unmount,
        P.PutStart,  # its holds (store/ha/journal.py: waited for only when large)
        P.PutEnd,
        P.PutRevoke,
        P.Remove,
        P.RemoveAll,
        P.TaskDone,
        P.ReplicaCopyStart,  # its targets' holds, as a PutStart's
        P.ReplicaCopyEnd,
        P.ReplicaDrop,
        P.ReplicaBad,
    )
)


class Durable(DeferredReply):
    """A mutation's reply, due once the log has its records: sent by the thread that makes
    them durable, the moment it does (``oplog.wait``'s ``on_commit``), else by the request
    thread."""

    __slots__ = ("oplog", "reply", "ticket")

    def __init__(self, oplog: OpLog, ticket: int, reply: P.Reply):
        self.oplog, self.ticket, self.reply = oplog, ticket, reply

    def resolve(self, sender: ReplySender) -> msgspec.Struct:
        reply = self.reply
        try:
            self.oplog.wait(self.ticket, on_commit=lambda: sender.try_send(reply))
        except LogFailed as exc:
            return P.Reply(code=RPC_FAIL, message=f"not acknowledged (master stepping down): {exc}")
        return reply


class DurableMaster(Master):
    """``DurableMaster(cfg, view, oplog)``: serves the state rebuilt from ``view`` (what
    ``oplog.load()`` returned) and makes every mutating request wait for the log. ``stop``
    closes the log."""

    def __init__(self, config: MasterConfig, view: View, oplog: OpLog, cluster: str = "kvcake"):
        super().__init__(
            config, state_factory=lambda cfg, **kw: build_state(cfg, view, **kw), cluster=cluster
        )
        assert isinstance(self.state, JournaledState)
        self.jstate: JournaledState = self.state
        self.oplog = oplog
        self.failover_s = 0.0  # HA: a failover's length (the election lease TTL)
        self.floor_wait_s = 0.0  # how long start() waited for the fence floor to be durable
        handlers = self.rpc.handlers
        plain = handlers.dispatch
        jstate = self.jstate
        dedup = jstate.dedup

        def dispatch(msg: msgspec.Struct) -> P.Reply | Durable:
            replays = dedup.replays
            reply = plain(msg)
            if type(msg) not in MUTATING:
                return reply
            ticket = jstate.flush(oplog)
            if not ticket and dedup.replays != replays:
                # Answered from the dedup table (or another request was, meanwhile: then the
                # wait is needless, not wrong): a retry whose first try's records may still be on their
                # way to the log (a try that timed out on the master call deadline is re-sent
                # while they are). It waits for everything logged so far, so it never
                # acknowledges ahead of the log (at once when the log is idle).
                ticket = oplog.appended
            return Durable(oplog, ticket, reply) if ticket else reply

        handlers.dispatch = dispatch  # type: ignore[method-assign,assignment]
        if hasattr(oplog, "source"):
            oplog.source = lambda: jstate.flush(oplog)

    def start(self) -> None:
        # The replayed clients' grace period starts now, not when the state was built (a slow
        # take-over must not expire every storage node before it could heartbeat us), and is
        # longer than a client TTL: a client's call may be stuck on the old leader until its
        # deadline, then it must find us (liveness.inherited_grace_s).
        grace = inherited_grace_s(self.cfg.client_ttl_s, self.failover_s)
        with self.jstate.lock:
            seen = self.jstate.clock() + grace - self.cfg.client_ttl_s
            for info in self.jstate.clients.values():
                info.last_seen = seen
            floor = self.jstate.parts.segs.fences.base
        # Durable before any fence is handed out: the next leader starts above it (fences.py).
        t0 = time.monotonic()
        self.oplog.wait(self.oplog.append([FenceRec(floor)]))
        self.floor_wait_s = time.monotonic() - t0
        super().start()

    def stop(self) -> None:
        """Stop serving, make what is queued durable, snapshot (a fast next start), close."""
        super().stop()
        try:
            self.jstate.flush(self.oplog)
            snapshot = getattr(self.oplog, "snapshot_now", None)
            if snapshot is not None:
                snapshot()
        except Exception as exc:  # fenced or broken: the next leader replays the log instead
            log.warning("master: no snapshot at stop: %s", exc)
        self.oplog.close()
