"""Disaggregated serving: instance processes, the OpenAI-compatible proxy with the live
conductor, the one-command local cluster (``kvcake up``) and the trace replayer. See docs/serve.md.
"""
