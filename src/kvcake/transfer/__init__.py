"""kvcake Transfer Engine: batched zero-copy transfers between registered memory segments,
over TCP (sliced, multi-path, with failover) or same-host shared memory. See docs/transfer.md.
"""

from kvcake.transfer.config import TransferConfig
from kvcake.transfer.engine import TransferEngine
from kvcake.transfer.errors import (
    EndpointsExhausted,
    InvalidRequest,
    NoPathAvailable,
    OutOfRange,
    OwnerGone,
    PathFailure,
    RemoteError,
    SegmentExists,
    TooManyBatches,
    TransferError,
    TransferTimeout,
    UnknownBatch,
    UnknownSegment,
)
from kvcake.transfer.metadata import (
    DirectoryBackend,
    DirectoryClient,
    DirectoryService,
    MemoryBackend,
)
from kvcake.transfer.shm import cleanup_stale
from kvcake.transfer.types import (
    BatchResult,
    BatchStatus,
    Op,
    PathInfo,
    RequestResult,
    SegmentInfo,
    TransferRequest,
)

__all__ = [
    "BatchResult",
    "BatchStatus",
    "DirectoryBackend",
    "DirectoryClient",
    "DirectoryService",
    "EndpointsExhausted",
    "InvalidRequest",
    "MemoryBackend",
    "NoPathAvailable",
    "Op",
    "OutOfRange",
    "OwnerGone",
    "PathFailure",
    "PathInfo",
    "RemoteError",
    "RequestResult",
    "SegmentExists",
    "SegmentInfo",
    "TooManyBatches",
    "TransferConfig",
    "TransferEngine",
    "TransferError",
    "TransferRequest",
    "TransferTimeout",
    "UnknownBatch",
    "UnknownSegment",
    "cleanup_stale",
]
