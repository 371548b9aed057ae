"""A KV index whose prefix match is fast enough for per-request scheduling.

:class:`PrefixIndex` is a drop-in :class:`kvcake.core.api.KVIndex` (same methods and meaning,
kept current by the same ``KVEvent``s) that stores, per block, the set of holders as a bitmask
(one bit per holder, assigned on the holder's first block and never reused). A prefix match is
then one dict lookup and one integer AND per block — O(matched blocks), independent of the
index size and cheap in the number of holders. Snapshot builders (simulator, proxy) should
construct this class; the conductor also accepts a plain ``KVIndex`` (slower path).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvcake.core.api import KVIndex
from kvcake.core.ids import BlockHash, InstanceId


class PrefixIndex(KVIndex):
    """Invariant: ``_count[h]`` == number of blocks whose mask has ``h``'s bit set."""

    def __init__(self) -> None:
        super().__init__()
        self._masks: dict[BlockHash, int] = {}
        self._bit: dict[InstanceId, int] = {}
        self._holder_of_bit: list[InstanceId] = []
        self._count_by_bit: list[int] = []

    # -- bits ----------------------------------------------------------------------------------

    def bit_of(self, holder: InstanceId) -> int:
        """The holder's bit position, or -1 if it never held a block."""
        return self._bit.get(holder, -1)

    def holder_of_bit(self, bit: int) -> InstanceId:
        return self._holder_of_bit[bit]

    @property
    def num_bits(self) -> int:
        """Bits assigned so far; grows when a new holder appears (a cache-key for callers)."""
        return len(self._holder_of_bit)

    def _bit_for(self, holder: InstanceId) -> int:
        bit = self._bit.get(holder)
        if bit is None:
            bit = self._bit[holder] = len(self._holder_of_bit)
            self._holder_of_bit.append(holder)
            self._count_by_bit.append(0)
        return bit

    # -- KVIndex API ---------------------------------------------------------------------------

    def add(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None:
        bit = self._bit_for(holder)
        flag, masks, added = 1 << bit, self._masks, 0
        for b in blocks:
            m = masks.get(b, 0)
            if not m & flag:
                masks[b] = m | flag
                added += 1
        self._count_by_bit[bit] += added

    def remove(self, holder: InstanceId, blocks: Iterable[BlockHash]) -> None:
        bit = self._bit.get(holder)
        if bit is None:
            return
        flag, masks, removed = 1 << bit, self._masks, 0
        for b in blocks:
            m = masks.get(b, 0)
            if m & flag:
                m &= ~flag
                if m:
                    masks[b] = m
                else:
                    del masks[b]
                removed += 1
        self._count_by_bit[bit] -= removed

    def drop_holder(self, holder: InstanceId) -> None:
        bit = self._bit.get(holder)
        if bit is None:
            return
        flag = 1 << bit
        self.remove(holder, [b for b, m in self._masks.items() if m & flag])

    def holders(self, block: BlockHash) -> frozenset[InstanceId]:
        return frozenset(self._holders_in(self._masks.get(block, 0)))

    def blocks_of(self, holder: InstanceId) -> int:
        bit = self._bit.get(holder)
        return 0 if bit is None else self._count_by_bit[bit]

    def prefix_matches(self, blocks: Sequence[BlockHash]) -> dict[InstanceId, int]:
        lens = self.match_lengths(blocks)
        names = self._holder_of_bit
        return {names[i]: n for i, n in enumerate(lens[:-1]) if n}

    def __len__(self) -> int:
        return len(self._masks)

    # -- fast path -----------------------------------------------------------------------------

    def match_lengths(self, blocks: Sequence[BlockHash]) -> list[int]:
        """``out[bit]`` = leading blocks of ``blocks`` that the holder with ``bit`` holds;
        ``out`` has ``num_bits + 1`` entries, the last always 0 (a slot for unknown holders).
        Stops at the first block nobody (still matching) holds: O(matched blocks)."""
        out = [0] * (len(self._holder_of_bit) + 1)
        n = len(blocks)
        if n == 0:
            return out
        get = self._masks.get
        m = get(blocks[0], 0)
        if not m:
            return out
        # Hot loop (once per scheduling decision): bit twiddling inlined on purpose; measured
        # faster than itertools.accumulate over the masks.
        for i, b in enumerate(blocks):
            nm = m & get(b, 0)
            if nm != m:
                d = m ^ nm
                if d & (d - 1):  # several holders stop here
                    while d:
                        low = d & -d
                        out[low.bit_length() - 1] = i
                        d ^= low
                else:  # one holder (the common case)
                    out[d.bit_length() - 1] = i
                if not nm:
                    return out
                m = nm
        while m:  # survivors hold every block
            low = m & -m
            out[low.bit_length() - 1] = n
            m ^= low
        return out

    def _holders_in(self, mask: int) -> list[InstanceId]:
        out = []
        while mask:
            low = mask & -mask
            out.append(self._holder_of_bit[low.bit_length() - 1])
            mask ^= low
        return out
