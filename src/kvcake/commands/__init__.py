"""Sub-commands of ``kvcake``: one module each, exposing ``register(subparsers)``."""
