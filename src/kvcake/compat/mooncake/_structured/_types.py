"""The value types of ``mooncake.structured_object_store``: policies, references, payloads, read
specs and the two caller-buffer wrappers (``tensor_object_buffer`` / ``raw_destination``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

PutMode = Literal["auto", "batch", "parallel"]
CopyMode = Literal["auto", "zero_copy", "copy"]


class BundleStore(Protocol):
    """The store methods every transfer needs; the others (``batch_put_from``,
    ``register_buffer``, ``get_into_ranges``, ``put_tensor``, ...) are used when present."""

    def put(self, key: str, value: Any, config: Any = None) -> int: ...

    def get(self, key: str) -> bytes: ...

    def remove(self, key: str, force: bool = False) -> int: ...

    def is_exist(self, key: str) -> int: ...


@dataclass(frozen=True)
class BundleTransferPolicy:
    """How a bundle's chunks are written: up to ``max_inflight_put`` concurrent writers
    (``put_mode`` ``parallel``), and whether caller memory is handed to the store in place
    (``zero_copy``), always copied (``copy``) or either (``auto``)."""

    max_inflight_put: int = 1
    put_mode: PutMode = "auto"
    copy_mode: CopyMode = "auto"

    def checked(self, max_inflight_put: int | None = None) -> BundleTransferPolicy:
        policy = self
        if max_inflight_put is not None:
            policy = BundleTransferPolicy(max_inflight_put, self.put_mode, self.copy_mode)
        if policy.max_inflight_put < 1:
            raise ValueError("max_inflight_put must be positive")
        if policy.put_mode not in ("auto", "batch", "parallel"):
            raise ValueError(f"unsupported put_mode: {policy.put_mode}")
        if policy.copy_mode not in ("auto", "zero_copy", "copy"):
            raise ValueError(f"unsupported copy_mode: {policy.copy_mode}")
        return policy


@dataclass(frozen=True)
class FieldSchema:
    """A codec hint for one DataProto field (``metadata["section"]`` pins its section)."""

    codec: str
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RemoteBundleRef:
    """A stored bundle: its manifest key and (when known) the manifest itself."""

    manifest_key: str
    manifest: dict[str, Any]


@dataclass(frozen=True, init=False)
class StructuredObjectPayload:
    """JSON metadata plus named members (arrays, tensors, bytes-like values)."""

    metadata: Mapping[str, Any]
    buffers: Mapping[str, Any]

    def __init__(
        self, metadata: Mapping[str, Any] | None = None, buffers: Mapping[str, Any] | None = None
    ) -> None:
        if buffers is None:
            raise TypeError("StructuredObjectPayload requires buffers")
        object.__setattr__(self, "metadata", {} if metadata is None else metadata)
        object.__setattr__(self, "buffers", buffers)


@dataclass
class StructuredObjectResult:
    metadata: dict[str, Any]
    objects: dict[str, Any]


@dataclass(frozen=True)
class StructuredFieldLocation:
    """Where a DataProto field lives: the stage's object and the member inside it."""

    stage: str
    member: str
    section: Literal["batch", "non_tensor_batch"]


@dataclass
class MooncakeDataProtoRef:
    """A DataProto stored as one structured object per stage."""

    batch_size: int
    stage_refs: dict[str, RemoteBundleRef]
    field_index: dict[str, StructuredFieldLocation]
    meta_info: dict[str, Any]
    namespace: str = "default"
    partition: str = "default"
    global_indexes: list[int] | None = None
    encoded_non_tensor: dict[str, Any] = field(default_factory=dict)
    _storage_group_id: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class StructuredMemberSlice:
    axis: int
    start: int
    end: int
    step: int = 1

    def bounds(self, rows: int) -> tuple[int, int, int]:
        if self.step <= 0:
            raise ValueError("structured ndarray slicing step must be positive")
        return slice(self.start, self.end, self.step).indices(rows)


@dataclass(frozen=True)
class StructuredObjectReadSpec:
    """What to read of a structured object: which members, and row slices of some."""

    ref: RemoteBundleRef | Mapping[str, Any]
    member_names: tuple[str, ...] | None = None
    member_slices: tuple[tuple[str, StructuredMemberSlice], ...] = ()

    def select_members(self, names: Sequence[str] | None) -> StructuredObjectReadSpec:
        chosen = None if names is None else tuple(names)
        return StructuredObjectReadSpec(self.ref, chosen, self.member_slices)

    def slice_member(
        self, name: str, axis: int, start: int, end: int, step: int = 1
    ) -> StructuredObjectReadSpec:
        slices = dict(self.member_slices)
        slices[name] = StructuredMemberSlice(axis, start, end, step)
        return StructuredObjectReadSpec(self.ref, self.member_names, tuple(slices.items()))

    def member_slice(self, name: str) -> StructuredMemberSlice | None:
        return dict(self.member_slices).get(name)


@dataclass(frozen=True)
class TensorObjectBuffer:
    """Caller memory holding a serialized tensor object (``[metadata][data]``)."""

    ptr: int
    size: int
    owner: Any
    batch_size: int | None = None

    def __len__(self) -> int:
        if self.batch_size is None:
            raise TypeError("tensor object buffer requires batch_size for DataProto use")
        return self.batch_size


@dataclass(frozen=True)
class RawDestination:
    """Caller memory a member is read into (``pre_registered``: already registered)."""

    ptr: int
    size: int
    owner: Any
    pre_registered: bool = False


def tensor_object_buffer(
    ptr: int, size: int, owner: Any = None, batch_size: int | None = None
) -> TensorObjectBuffer:
    return TensorObjectBuffer(int(ptr), int(size), owner, batch_size)


def raw_destination(
    ptr: int, size: int, owner: Any = None, *, pre_registered: bool = False
) -> RawDestination:
    return RawDestination(int(ptr), int(size), owner, pre_registered)
