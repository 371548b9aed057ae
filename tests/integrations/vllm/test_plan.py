"""Pure logic of the connector (no vLLM process): planning, keys, config."""

from __future__ import annotations

import pytest

from kvcake.core.errors import ConfigError
from kvcake.core.hashing import block_hashes, block_key
from kvcake.integrations.vllm.config import ConnectorConfig
from kvcake.integrations.vllm.keys import BlockNamer, tenant_root
from kvcake.integrations.vllm.plan import Planner

NAMER = BlockNamer("m@vllm", "float32", 4)


def test_keys_are_kvcake_chained_hashes_with_model_dtype_block_size() -> None:
    toks = list(range(10))
    want = [block_key("m@vllm", "float32", 4, h) for h in block_hashes(toks, 4)]
    assert NAMER.keys(toks) == want and len(want) == 2
    assert BlockNamer("m@vllm", "float32", 4, tenant="t").keys(toks) != want
    assert tenant_root("t") == tenant_root("t") != tenant_root("u")


def pooled(n: int):  # the first n keys of any prompt are in the pool
    return lambda keys: [i < n for i in range(len(keys))]


def test_match_leaves_one_token_and_counts_from_local_hit() -> None:
    p = Planner(NAMER)
    assert p.match("r", list(range(12)), 0, pooled(3)) == 8  # 3 pooled, last token computed
    assert p.match("r", list(range(13)), 0, pooled(3)) == 12
    assert p.match("r", list(range(13)), 4, pooled(3)) == 8  # local hit of 1 block
    assert p.match("r", list(range(13)), 12, pooled(3)) == 0
    assert p.match("r", list(range(13)), 0, None) == 0 and len(p) == 0
    assert p.match("r", list(range(13)), 0, pooled(0)) == 0


def test_load_covers_external_blocks_then_saves_the_rest_once() -> None:
    p = Planner(NAMER)
    prompt = list(range(21))  # 5 full blocks
    assert p.match("r", prompt, 4, pooled(3)) == 8
    p.allocated("r", [10, 11, 12, 13, 14, 15], 8)
    plan = p.step([("r", [10, 11, 12, 13, 14, 15], True, 14)])
    assert [(r.keys, r.block_ids) for r in plan.loads] == [(NAMER.keys(prompt)[1:3], [11, 12])]
    assert [r.block_ids for r in plan.saves] == []  # block 3 is not complete yet (14 < 16)
    plan = p.step([("r", None, False, 21)])  # chunked prefill finishes
    assert plan.loads == [] and [r.block_ids for r in plan.saves] == [[13, 14]]
    assert p.step([("r", [16], False, 22)]).saves == []  # decode tokens are not saved
    p.finished("r")
    assert len(p) == 0


def test_no_save_when_disabled_and_unknown_requests_ignored() -> None:
    p = Planner(NAMER, save=False)
    p.match("r", list(range(9)), 0, pooled(0))
    assert p.step([("r", [1, 2, 3], True, 9), ("x", [4], True, 9)]).saves == []


def test_allocated_checks_block_count() -> None:
    p = Planner(NAMER)
    p.match("r", list(range(13)), 0, pooled(3))
    with pytest.raises(ValueError):
        p.allocated("r", [1], 12)


def test_config_validation() -> None:
    assert ConnectorConfig.from_extra({"master": "h:1", "save": "false"}).save is False
    with pytest.raises(ConfigError, match="master"):
        ConnectorConfig.from_extra({})
    with pytest.raises(ConfigError, match="unknown"):
        ConnectorConfig.from_extra({"master": "h:1", "masterr": 1})
    with pytest.raises(ConfigError, match="load_timeout_s"):
        ConnectorConfig.from_extra({"master": "h:1", "load_timeout_s": 0})
    with pytest.raises(ConfigError, match="protocol"):
        ConnectorConfig.from_extra({"master": "h:1", "protocol": "rdma"})
