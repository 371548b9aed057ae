"""Whether this master may answer at all, checked right before each reply is sent.

An HA master holds its leadership through an etcd lease (:class:`~kvcake.store.ha.election.
Election`); a master that has lost it, or cannot be sure it still has it (its lease's deadline
passed, e.g. while it was SIGSTOPped), must answer nothing from its state: a standby may have
taken over and changed it. Every reply is stamped with the term it was answered in, so a
client can also drop a reply from an older term than one it has seen (store/rpc.py).
A master without HA (or with ``--state-dir``) always leads, in term 0.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from kvcake.store import protocol as P
from kvcake.store.errors import RPC_FAIL


class Leadership(Protocol):
    @property
    def term(self) -> int: ...

    def held(self) -> bool:
        """True while the lease surely holds; False (and the term is over) otherwise."""
        ...


class Sole:
    """The one master of a pool without HA: always leads, term 0."""

    term = 0

    def held(self) -> bool:
        return True


SOLE = Sole()
# What a request gets without the lease, before its reply is sealed (then refused in full).
NOT_HELD = P.ErrorReply(RPC_FAIL, "not the leader")


def seal(reply: msgspec.Struct, lead: Leadership) -> tuple[msgspec.Struct, bool]:
    """The reply as it goes on the wire: stamped with our term, or, when the lease is not held
    at this moment, a refusal (``RPC_FAIL``: the client finds the leader again through etcd)
    instead of an answer from a state that may be stale. Second item: still serving."""
    if lead.held():
        reply.term = lead.term  # type: ignore[attr-defined]
        return reply, True
    message = f"not the leader: the lease of term {lead.term} is not held"
    return P.ErrorReply(RPC_FAIL, message, lead.term), False
