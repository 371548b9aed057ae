"""Client liveness, both sides.

Client side: a thread that pings the master every ``client_ttl / 3`` on its own connection;
when the master answers "unknown client" (it expired us, e.g. after a pause) the
``on_remount`` callbacks re-mount our segments. Every master call has a deadline well under
the TTL (:func:`call_deadline_s`), so a heartbeat never waits on a frozen master's socket for
long; after a failed round the next one comes soon (``RETRY_S``, doubling while they fail),
not an interval later.

Master side: how long a client may stay silent. A new leader gives the clients it inherits
:func:`inherited_grace_s`; a master measures its own pauses (:class:`PauseWatch`) and does not
count them as the clients' silence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kvcake.core.backoff import backoff_s
from kvcake.core.clocks import boottime
from kvcake.core.errors import KvcakeError
from kvcake.store import protocol as P
from kvcake.store.rpc import MasterConnection
from kvcake.transfer.fences import FenceBook

if TYPE_CHECKING:
    from kvcake.store.master_state import MasterState

log = logging.getLogger(__name__)
DEFAULT_CLIENT_TTL_S = 10.0  # MasterConfig.client_ttl_s's default: until the master tells us
RETRY_S = 0.2  # a failed heartbeat round is retried this soon (capped by the interval)
PAUSE_S = 0.25  # a housekeeping gap longer than this is the master's own pause


def call_deadline_s(
    client_ttl_s: float, rpc_timeout_s: float = 30.0, configured: float = 0.0
) -> float:
    """The deadline of one master call (a try; a timed-out try goes to the leader again):
    ``configured`` (``master_call_timeout_s``) if set, else a third of the client TTL (what a
    heartbeat may lose before the master gives up on us), at most the RPC timeout."""
    if configured > 0:
        return configured
    return min(rpc_timeout_s, client_ttl_s / 3)


def inherited_grace_s(client_ttl_s: float, failover_s: float) -> float:
    """How long a new leader waits for a client it inherited from the log before it may
    expire it: the client's call stuck on the old leader ends after its deadline, then it finds
    the new leader (a failover: up to the election lease's TTL), then its TTL as usual."""
    return client_ttl_s + call_deadline_s(client_ttl_s) + failover_s


class PauseWatch:
    """Notices the master's own pauses (SIGSTOP, a suspended host, a long stall) from the gaps
    between two :meth:`tick` calls of its housekeeping loop on ``CLOCK_BOOTTIME``, and moves
    every client's last-seen time forward by the pause: a client cannot be heard while the
    master is stopped, so that time is not its silence. Without this a master woken after more
    than a TTL expired every client before their heartbeats (queued in its sockets) were read."""

    def __init__(self, state: MasterState, interval_s: float):
        self.state = state
        self.interval_s = interval_s
        self._last = boottime()

    def tick(self) -> float:
        """Call once per housekeeping round, before expiring anyone; the pause found (s)."""
        now = boottime()
        gap, self._last = now - self._last, now
        if gap <= PAUSE_S + self.interval_s:
            return 0.0
        pause = gap - self.interval_s
        with self.state.lock:
            now = self.state.clock()
            for info in self.state.clients.values():
                if info.last_seen < now:  # (a heartbeat read since the wake counts as it is)
                    info.last_seen = min(info.last_seen + pause, now)
        log.warning("master: paused for %.1fs: client deadlines moved by as much", pause)
        return pause


class Heartbeater:
    def __init__(
        self,
        conn: MasterConnection,
        client: str,
        host: str,
        ttl_s: float,
        on_remount: list[Callable[[], None]],
        directory: Callable[[], str] | None = None,
        on_forgotten: Sequence[Callable[[], object]] = (),
        fences: FenceBook | None = None,
    ):
        self.conn = conn
        # The transfer server's book of write fences: each reply's allocations are noted in
        # it, and the next heartbeat acknowledges them (store/fences.py).
        self.fences = fences if fences is not None else FenceBook()
        self.directory = directory  # the Transfer Engine directory we publish in now
        self.client = client
        self.host = host
        self.interval = max(0.02, ttl_s / 3)
        self.on_remount = on_remount
        # Run before the remount when the master forgot us (not when a new leader replayed
        # us, nor when it only moved): it dropped our objects, so bytes still on their way
        # for them (TCP's retransmission after a partition) must not land in ranges the new
        # mount hands out again (nemesis seed 4013, docs/benchmarks.md "Nemesis").
        self.on_forgotten = on_forgotten
        self.master_ok = True
        self._failed = 0  # rounds failed in a row
        self._remount_due = False  # a remount raised: the next answered round repeats it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _pause(self) -> float:
        """An interval after a good round; after a failed one the next comes soon (its try
        already cost up to the call deadline, and a failover wants us at the new leader),
        backing off to the interval while they keep failing (no leader elected yet)."""
        if not self._failed:
            return self.interval
        return backoff_s(min(self._failed, 9), RETRY_S, self.interval)  # <= 8 doublings

    def _run(self) -> None:
        while not self._stop.wait(self._pause()):
            try:
                reply = self.conn.call(P.Heartbeat(self.client, self.host, self.fences.newest))
                self.fences.floor(reply.floors)
                self.fences.note(reply.fences)
                self.master_ok = True
                self._failed = 0
                self._answer(reply)
            except KvcakeError as exc:
                self.master_ok = False
                self._failed += 1
                log.debug("heartbeat failed: %s", exc)
            except Exception:  # e.g. an OSError of a remount's directory publish
                # This thread is the client's only way back into a master that forgot it: it
                # must outlive any failure of one round (the next heartbeat tries again).
                self.master_ok = False
                self._failed += 1
                log.warning("store client %s: heartbeat round failed", self.client, exc_info=True)

    def _answer(self, reply: P.Reply) -> None:
        """Mount again when the master asks, or when the last remount did not finish: a
        remount that failed after its first ``Mount`` made the master know us again, so the
        next answer says nothing, yet a segment (the disk tier's) would stay unmounted."""
        if not (reply.count or self._remount_due or self._directory_moved(reply.directory)):
            return
        log.warning("store client %s: master forgot us or moved; remounting", self.client)
        self._remount_due = True  # until every hook has run
        for fn in self.on_forgotten if reply.count == P.FORGOTTEN else ():
            fn()
        for fn in self.on_remount:
            fn()
        self._remount_due = False

    def _directory_moved(self, where: str) -> bool:
        """A new leader that already knows us (our first data call reached it before this
        heartbeat) never says "remount", yet its directory is another one: a client that kept
        the dead leader's directory failed every peer lookup (the nemesis: 15 % of writes)."""
        current = self.directory() if self.directory is not None else ""
        return bool(where) and bool(current) and where != current

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.conn.close()
