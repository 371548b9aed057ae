"""Typed identifiers shared by every component.

They are plain ``str``/``int`` at run time; ``NewType`` lets mypy catch a segment name passed
where an instance id is expected.
"""

from typing import NewType

RequestId = NewType("RequestId", str)
InstanceId = NewType("InstanceId", str)
SegmentName = NewType("SegmentName", str)
ClientId = NewType("ClientId", str)
ObjectKey = NewType("ObjectKey", str)
BatchId = NewType("BatchId", int)
# A chained block hash: 64-bit unsigned. Equal hashes mean equal token prefixes.
BlockHash = NewType("BlockHash", int)
