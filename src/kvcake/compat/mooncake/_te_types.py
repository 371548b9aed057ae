"""The value types of ``mooncake.engine``: ``TransferOpcode`` (``Read`` / ``Write``) and
``TransferNotify``."""

from __future__ import annotations

from enum import IntEnum

from kvcake.transfer import Op


class TransferOpcode(IntEnum):
    Read = 0
    Write = 1

    def __str__(self) -> str:
        return f"TransferOpcode.{self.name}"


Read, Write = TransferOpcode.Read, TransferOpcode.Write
_Opcode = TransferOpcode


def to_op(opcode: _Opcode) -> Op:
    """Mooncake's opcode (enum or int) as the Transfer Engine's operation."""
    return Op.WRITE if TransferOpcode(opcode) is TransferOpcode.Write else Op.READ


class TransferNotify:
    def __init__(self, name: str = "", msg: str = ""):
        self.name, self.msg = name, msg

    def __repr__(self) -> str:
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"
