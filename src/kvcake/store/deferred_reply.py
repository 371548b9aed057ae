"""Replies that are due later than their dispatch returns (a durable master's mutations wait
for the operation log), and may be sent by another thread than the connection's own.

Why another thread: under 16 writing clients on 2 vCPUs, waking each request thread after a
commit so that it sends its own reply took ~0.5 ms at p50 (1.7 ms at p90) against a ~1.5 ms
etcd transaction; the thread that made the records durable sends the replies at once instead
(docs/benchmarks.md, "Store HA").

Ownership of the socket: while the connection's thread is inside :meth:`DeferredReply.resolve`
it does not touch its socket, so the one call to :meth:`ReplySender.try_send` that ``resolve``
lets happen owns the socket for that call. ``try_send`` never blocks: a client that stops
reading must hold up only its own connection's thread, never the thread that tried (the log's
writer, which every commit waits for).
"""

from __future__ import annotations

import socket

import msgspec

from kvcake.store import protocol as P
from kvcake.store.leadership import SOLE, Leadership, seal
from kvcake.store.rpc import encode_msg, send_msg


class ReplySender:
    """One reply on one connection. ``try_send`` (any thread) sends what the socket takes at
    once, sealed (store/leadership.py: only while the lease holds, stamped with the term);
    ``finish`` (the connection's thread, afterwards) sends the rest, or the whole reply when
    nobody tried (the connection's thread seals that one)."""

    __slots__ = ("conn", "lead", "rest", "rid")

    def __init__(self, conn: socket.socket, rid: int, lead: Leadership = SOLE):
        self.conn, self.rid, self.lead = conn, rid, lead
        self.rest: memoryview | None = None  # None: not tried; empty: all sent

    def try_send(self, reply: msgspec.Struct) -> None:
        reply, serving = seal(reply, self.lead)
        if not serving:  # not tried: the connection's thread sends the refusal
            return
        data = encode_msg(P.REPLY_CODEC, self.rid, reply)
        try:
            sent = self.conn.send(data, socket.MSG_DONTWAIT)
        except OSError:  # full (EAGAIN) or broken: the connection's thread sends or meets it
            sent = 0
        self.rest = memoryview(data)[sent:]

    @property
    def sent(self) -> bool:
        """The whole reply is on the wire."""
        return self.rest is not None and not self.rest

    def finish(self, reply: msgspec.Struct) -> None:
        if self.rest is None:
            send_msg(self.conn, P.REPLY_CODEC, self.rid, reply)
        elif self.rest:
            self.conn.sendall(self.rest)


class DeferredReply:
    """What a dispatch returns when its reply must wait. The connection's thread calls
    :meth:`resolve`, which blocks until the reply is due and returns it; before that, another
    thread may already have sent it through ``sender.try_send`` (then ``sender.finish`` sends
    only what the socket did not take)."""

    def resolve(self, sender: ReplySender) -> msgspec.Struct:
        raise NotImplementedError
