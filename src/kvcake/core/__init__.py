"""Shared foundation: IDs, errors, config, hashing, framing, cost model, traces, interface types.

Everything here is pure Python + numpy + msgspec; no sockets are opened and no torch is imported,
so every other package (including the conductor and the simulator) may depend on it.
"""
