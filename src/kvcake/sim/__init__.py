"""Discrete-event simulator: replays Mooncake traces at cluster scale through the conductor.

``kvcake.sim`` imports no sockets and no torch. Entry points: :func:`kvcake.sim.runner.simulate`
and the experiments in :mod:`kvcake.sim.experiments` (``kvcake sim ...``).
"""
