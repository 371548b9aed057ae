"""``dataproto_manifest_view``: each field's section, stage, member and stored spec (for encoded
fields the codec, its metadata and the specs of its payload members), read from the stage
manifests."""

from __future__ import annotations

from typing import Any

from kvcake.compat.mooncake._structured._fields import field_specs
from kvcake.compat.mooncake._structured._objects import StructuredObjects
from kvcake.compat.mooncake._structured._types import MooncakeDataProtoRef

BYTES = {"encoding": "bytes"}


def _spec(specs: dict[str, Any], member: str, encoded: dict[str, Any] | None) -> dict[str, Any]:
    if encoded is None:
        return dict(specs.get(member, BYTES))
    parts = dict(encoded["payload_members"])
    return {
        "encoding": "structured_non_tensor",
        "codec": encoded["codec"],
        "metadata": encoded.get("metadata"),
        "payload_members": parts,
        "payload_specs": {p: dict(specs.get(m, BYTES)) for p, m in parts.items()},
    }


def manifest_view(objects: StructuredObjects, ref: MooncakeDataProtoRef) -> dict[str, Any]:
    metas = {
        stage: objects.read_metadata(objects.bundles.resolve(stage_ref))
        for stage, stage_ref in ref.stage_refs.items()
    }
    fields = {}
    for name, loc in ref.field_index.items():
        specs = field_specs(metas[loc.stage])
        fields[name] = {
            "section": loc.section,
            "stage": loc.stage,
            "member": loc.member,
            "spec": _spec(specs, loc.member, ref.encoded_non_tensor.get(name)),
        }
    return {
        "namespace": ref.namespace,
        "partition": ref.partition,
        "batch_size": ref.batch_size,
        "batch_fields": {n: f for n, f in fields.items() if f["section"] == "batch"},
        "non_tensor_fields": {n: f for n, f in fields.items() if f["section"] != "batch"},
        "meta_info_keys": list(ref.meta_info),
        "stages": {
            stage: {"manifest_key": r.manifest_key, "dataproto": metas[stage].get("dataproto", {})}
            for stage, r in ref.stage_refs.items()
        },
    }
