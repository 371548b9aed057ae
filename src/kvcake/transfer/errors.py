"""Typed Transfer Engine errors; all derive from :class:`kvcake.core.errors.TransferError`."""

from __future__ import annotations

from kvcake.core.errors import TransferError

__all__ = [
    "AuthFailed",
    "DirectoryUnreachable",
    "EndpointsExhausted",
    "InvalidRequest",
    "NoPathAvailable",
    "OutOfRange",
    "PathFailure",
    "RemoteError",
    "SegmentExists",
    "TransferError",
    "TransferTimeout",
    "UnknownBatch",
    "UnknownSegment",
]


class UnknownSegment(TransferError, KeyError):
    """No segment of that name is registered (locally or in the directory)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DirectoryUnreachable(TransferError):
    """The segment directory did not answer (refused, reset, timed out) after one reconnect;
    under HA its master may have died: ask the new leader where the directory is now."""


class SegmentExists(TransferError):
    """A segment of that name is already registered."""


class OutOfRange(TransferError):
    """Offset/length fall outside the segment."""


class InvalidRequest(TransferError, ValueError):
    """A request is malformed (zero or negative length, negative offset, wrong op)."""


class NoPathAvailable(TransferError):
    """Every path to the target's owner has failed; the slices could not be delivered."""


class OwnerGone(NoPathAvailable):
    """The process that owns a same-host segment has exited: its shared memory is no longer
    read or written (the directory entry may not have been dropped yet)."""


class PathFailure(TransferError):
    """One path (connection) broke; its unfinished slices are retried elsewhere."""


class EndpointsExhausted(TransferError):
    """Every pooled connection stayed busy for ``io_timeout_s``; the path itself may be fine."""


class AuthFailed(TransferError):
    """The peer refused this engine's shared secret, or wants one this engine lacks (never
    retried: another path of the same peer has the same secret)."""


class RemoteError(TransferError):
    """The remote transfer server refused a slice (its reason is in the message)."""


class UnknownBatch(TransferError, KeyError):
    """The batch id was never issued or was already collected by ``wait``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TooManyBatches(TransferError):
    """``transfer.max_batches`` submitted batches are still running or uncollected."""


class TransferTimeout(TransferError, TimeoutError):
    """``wait`` gave up before the batch finished."""


class StaleWrite(TransferError):
    """A write carrying an older allocation's fence into a range the master has since handed
    to a newer one (transfer/fences.py): refused, nothing of it lands."""
