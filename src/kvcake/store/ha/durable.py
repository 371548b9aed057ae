"""A master whose acknowledged mutations are durable: each mutating request is applied, its
changes are appended to the operation log, and the reply waits until the log has them.

Built on the plain :class:`~kvcake.store.master_server.Master` through two narrow seams: the
state object (a :class:`JournaledState`, usually rebuilt from the log by :func:`build_state`)
and the handlers' ``dispatch``. A log that fails (fenced by a new leader, storage gone) turns
every later mutating reply into ``RpcFailed`` (-900; clients retry elsewhere) and calls
``on_failure`` so the owner can step down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from kvcake.store import protocol as P
from kvcake.store.config import MasterConfig
from kvcake.store.errors import RPC_FAIL
from kvcake.store.ha.journal import JournaledState
from kvcake.store.ha.oplog import LogFailed, OpLog
from kvcake.store.master_server import Master, MasterHandlers
from kvcake.store.metrics import MasterMetrics

log = logging.getLogger(__name__)

# Requests whose effects must be durable before their reply (reads, heartbeats and task polls
# change nothing the log records).
MUTATING: frozenset[type] = frozenset(
    (P.Mount, P.Unmount, P.PutStart, P.PutEnd, P.PutRevoke, P.Remove, P.RemoveAll, P.TaskDone)
)


class DurableHandlers(MasterHandlers):
    def __init__(self, state: JournaledState, directory: Callable[[], str], oplog: OpLog):
        super().__init__(state, directory)
        self.jstate = state
        self.oplog = oplog

    def dispatch(self, msg: msgspec.Struct) -> P.Reply:
        reply = super().dispatch(msg)
        if type(msg) not in MUTATING:
            return reply
        try:
            self.oplog.wait(self.jstate.flush(self.oplog))
        except LogFailed as exc:
            return P.Reply(code=RPC_FAIL, message=f"not acknowledged (master stepping down): {exc}")
        return reply


class DurableMaster(Master):
    """``DurableMaster(cfg, state, oplog)``: ``state`` is what the log replayed; the log is
    started (``oplog.load()``) by the caller and closed by :meth:`stop`."""

    def __init__(self, config: MasterConfig, state: JournaledState, oplog: OpLog):
        super().__init__(config)
        # Keep any hooks the plain master wired into its own state (e.g. owner liveness).
        for name in ("owner_dead",):
            if hasattr(self.state, name):
                setattr(state, name, getattr(self.state, name))
        self.state: JournaledState = state
        self.oplog = oplog
        self.metrics = MasterMetrics(state)
        self.rpc.metrics = self.metrics
        self.rpc.handlers = DurableHandlers(state, lambda: self.directory_address, oplog)
        if hasattr(oplog, "source"):
            oplog.source = lambda: state.flush(oplog)

    def stop(self) -> None:
        """Stop serving, make what is queued durable, snapshot (a fast next start), close."""
        super().stop()
        try:
            self.state.flush(self.oplog)
            snapshot = getattr(self.oplog, "snapshot_now", None)
            if snapshot is not None:
                snapshot()
        except Exception as exc:  # fenced or broken: the next leader replays the log instead
            log.warning("master: no snapshot at stop: %s", exc)
        self.oplog.close()
