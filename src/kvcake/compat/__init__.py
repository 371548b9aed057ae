"""Compatibility shims that let existing callers use kvcake unchanged."""
