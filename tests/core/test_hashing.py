import subprocess
import sys

import numpy as np
import pytest

from kvcake.core.hashing import ROOT_HASH, block_hashes, block_key, common_prefix_blocks, hash_block

# Golden values: these must never change, or every stored KV block is orphaned.
GOLDEN = ["b04cdd2f1be6823a", "b60df09c3afff098"]
GOLDEN_EMPTY = 11156314776652445987


def test_golden_values() -> None:
    hs = block_hashes(list(range(8)), 4)
    assert [f"{h:016x}" for h in hs] == GOLDEN
    assert hash_block(ROOT_HASH, []) == GOLDEN_EMPTY


def test_chaining_means_equal_prefix() -> None:
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)
    b = block_hashes([1, 2, 3, 4, 5, 6, 7, 9], 4)
    c = block_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert a[0] == b[0] and a[1] != b[1]
    # Same second block content but a different first block: different hash (chained).
    assert c[1] != a[1]
    assert common_prefix_blocks(a, b) == 1


def test_partial_block_not_named() -> None:
    assert len(block_hashes(list(range(10)), 4)) == 2
    assert block_hashes([1, 2, 3], 4) == []


def test_numpy_and_list_agree() -> None:
    toks = list(range(100, 164))
    assert block_hashes(toks, 16) == block_hashes(np.array(toks, dtype=np.int32), 16)


def test_stable_across_processes() -> None:
    code = "from kvcake.core.hashing import block_hashes; print(block_hashes(list(range(8)), 4))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1
    assert outs.pop().strip() == str(block_hashes(list(range(8)), 4))


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        block_hashes([1, 2], 0)
    with pytest.raises(ValueError):
        hash_block(ROOT_HASH, [-1])
    with pytest.raises(ValueError):
        hash_block(ROOT_HASH, [[1, 2]])


def test_block_key_format() -> None:
    assert block_key("m", "float32", 32, 0xAB) == "m/float32/32/00000000000000ab"
