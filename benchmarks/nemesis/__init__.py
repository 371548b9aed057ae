"""The nemesis (issue 30 §3): a Jepsen-style workload and fault schedule against an HA store.

Modules: :mod:`.values` (self-describing values), :mod:`.worker` (a client process that records
its history), :mod:`.checker` (pure: wrong reads, lost objects, outages), :mod:`.cluster` (the
processes and the emulated hosts), :mod:`.faults` (the seeded schedule). The command line is
``benchmarks/nemesis.py``; docs/benchmarks.md, "Nemesis".
"""
