"""``infer_structure`` and ``MISSING`` (mooncake.structured_object_store): the nodes, leaves and
codec decisions expected here are what Mooncake's wheel (0.3.13.post1) returns for the same
values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcake.compat.mooncake.structured_object_store import MISSING, infer_structure


def infer(values: list[Any]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    leaves: list[Any] = []
    nodes: list[Any] = []
    infer_structure("$", values, leaves, nodes)
    got_nodes = [(n.path, n.node_type, n.children, n.lengths, n.row_mask) for n in nodes]
    got_leaves = [
        (
            leaf.path,
            leaf.values,
            leaf.decision.accepted,
            leaf.decision.codec,
            leaf.decision.metadata,
        )
        for leaf in leaves
    ]
    return got_nodes, got_leaves


def test_missing_is_a_sentinel() -> None:
    assert repr(MISSING) == "<MISSING>" and MISSING is not None and bool(MISSING)


def test_dicts_expand_into_columns_with_missing_keys() -> None:
    nodes, leaves = infer([{"a": 1, "b": "x"}, {"a": 2}, None])
    assert nodes == [("$", "dict", ["a", "b"], None, [True, True, False])]
    assert leaves == [
        ("$.a", [1, 2, None], True, "ndarray", {"dtype": "int64"}),
        ("$.b", ["x", MISSING, None], True, "utf8_ragged", {}),
    ]


def test_lists_of_containers_expand_by_index() -> None:
    nodes, leaves = infer([[{"x": 1}, None], [], None])
    assert nodes == [
        ("$", "list", [0, 1], [2, 0, 0], [True, True, False]),
        ("$[0]", "dict", ["x"], None, [True, False, False]),
    ]
    assert leaves == [
        ("$[0].x", [1, None, None], True, "ndarray", {"dtype": "int64"}),
        ("$[1]", [None, MISSING, None], False, "msgpack_ragged", {}),
    ]


def test_keys_are_escaped_and_ndarray_leaves_are_typed() -> None:
    nodes, leaves = infer([{"a.b": np.arange(2)}, {"a.b": np.arange(3.0)}])
    assert nodes == [("$", "dict", ["a.b"], None, [True, True])]
    assert leaves[0][0] == "$.a\\.b"
    assert leaves[0][2:] == (True, "typed_ragged", {"recursive_source": "ndarray"})


@pytest.mark.parametrize(
    ("values", "accepted", "codec", "reason"),
    [
        ([1, 2.5, None], True, "ndarray", "all rows are numeric scalar"),
        ([True, 2], True, "ndarray", "all rows are numeric scalar"),
        (["a", 1], False, "msgpack_ragged", "no codec matched"),
        ([[1, 2], [3]], True, "typed_ragged", "all rows are numeric sequences"),
        ([None, None], False, "msgpack_ragged", "all rows are null"),
        ([b"x", memoryview(b"y")], True, "bytes_ragged", "all rows are bytes-like"),
        ([{1: 2}], True, "msgpack_ragged", "all rows are msgpack-like"),
        ([[1, [2]]], True, "msgpack_ragged", "all rows are msgpack-like"),
        ([np.array(["a"])], False, "msgpack_ragged", "object ndarray rows"),
        ([[b"a"], []], True, "media_list_ragged", "all rows are media lists"),
    ],
)
def test_leaf_decisions(values: list[Any], accepted: bool, codec: str, reason: str) -> None:
    leaves: list[Any] = []
    infer_structure("$", values, leaves, [])
    decision = leaves[0].decision
    assert (decision.accepted, decision.codec, decision.reason) == (accepted, codec, reason)


def test_tensor_leaves_need_one_dtype() -> None:
    torch = pytest.importorskip("torch")
    _, leaves = infer([torch.ones(2), torch.ones(3)])
    assert leaves[0][2:] == (True, "ragged_tensor", {"dtype": "torch.float32"})
    _, leaves = infer([torch.ones(2), torch.ones(3, dtype=torch.int32)])
    assert leaves[0][2:4] == (False, "ragged_tensor")


def test_depth_is_bounded() -> None:
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(40):
        cur["a"] = {}
        cur = cur["a"]
    with pytest.raises(ValueError, match="infer_structure exceeded max depth 32"):
        infer([deep])
