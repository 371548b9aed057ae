"""The serve tests' shared emulated cluster (1 prefill, 2 decode, master + one storage node):
imported, not redefined, so its setup stays in one place."""

from tests.serve.conftest import emulated_cluster  # noqa: F401
