"""kvcake's ``mooncake.structured_object_store``: Mooncake's structured objects (named arrays,
tensors and buffers under one JSON manifest), their bundles and DataProto helpers, over any
Mooncake-style store. Status per name: docs/compat/mooncake.md."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvcake.compat.mooncake._structured._dp_infer import MISSING, infer_structure
from kvcake.compat.mooncake._structured._dp_infer import (  # noqa: F401 (the wheel's names)
    choose_leaf as _choose_leaf_codec,
)
from kvcake.compat.mooncake._structured._dp_infer import (  # noqa: F401 (the wheel's names)
    escape_key as _escape_key,
)
from kvcake.compat.mooncake._structured._fields import FIELD_SPECS_KEY as STRUCTURED_FIELD_SPECS_KEY
from kvcake.compat.mooncake._structured._handles import (
    HANDLE_TYPE as DATAPROTO_REF_HANDLE_TYPE,
)
from kvcake.compat.mooncake._structured._handles import (
    HANDLE_VERSION as DATAPROTO_REF_HANDLE_VERSION,
)
from kvcake.compat.mooncake._structured._handles import (
    STORAGE_GROUP_ID,
    export_dataproto_ref,
    import_dataproto_ref,
    is_dataproto_ref_handle,
)
from kvcake.compat.mooncake._structured._port import MISSING as MISSING_OBJECT_ERROR
from kvcake.compat.mooncake._structured._transfer import (
    DEFAULT_BUNDLE_CHUNK_BYTES,
    MooncakeBundleTransfer,
)
from kvcake.compat.mooncake._structured._types import (
    BundleStore,
    BundleTransferPolicy,
    FieldSchema,
    MooncakeDataProtoRef,
    RemoteBundleRef,
    StructuredFieldLocation,
    StructuredMemberSlice,
    StructuredObjectPayload,
    StructuredObjectReadSpec,
    StructuredObjectResult,
    raw_destination,
    tensor_object_buffer,
)
from kvcake.compat.mooncake._structured._writer import (
    AUTO_PARALLEL_MIN_BYTES,
    AUTO_PARALLEL_MIN_CHUNKS,
)

DataProtoRefLike = MooncakeDataProtoRef | Mapping[str, Any]
export_ref = export_dataproto_ref
import_ref = import_dataproto_ref
__kvcake__ = True
# The wheel's private module-level helpers that Mooncake's own suites import by name
# (test_put_get_tensor.py's codec-inference tests): kvcake's implementations, same contract.
_PRIVATE_HELPERS = ("_choose_leaf_codec", "_escape_key")

__all__ = [
    "AUTO_PARALLEL_MIN_BYTES",
    "AUTO_PARALLEL_MIN_CHUNKS",
    "DATAPROTO_REF_HANDLE_TYPE",
    "DATAPROTO_REF_HANDLE_VERSION",
    "DEFAULT_BUNDLE_CHUNK_BYTES",
    "MISSING",
    "MISSING_OBJECT_ERROR",
    "STORAGE_GROUP_ID",
    "STRUCTURED_FIELD_SPECS_KEY",
    "BundleStore",
    "BundleTransferPolicy",
    "DataProtoRefLike",
    "FieldSchema",
    "MooncakeBundleTransfer",
    "MooncakeDataProtoRef",
    "RemoteBundleRef",
    "StructuredFieldLocation",
    "StructuredMemberSlice",
    "StructuredObjectPayload",
    "StructuredObjectReadSpec",
    "StructuredObjectResult",
    "export_dataproto_ref",
    "export_ref",
    "import_dataproto_ref",
    "import_ref",
    "infer_structure",
    "is_dataproto_ref_handle",
    "raw_destination",
    "tensor_object_buffer",
]
