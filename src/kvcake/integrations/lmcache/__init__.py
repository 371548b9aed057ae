"""kvcake as LMCache's storage (docs/integrations/lmcache.md).

``connector``: a ``RemoteConnector`` plugin for LMCache's in-process engine (imports LMCache, so
it is loaded only by LMCache, in the LMCache venv). ``l2``: a ``native_plugin`` L2 for LMCache's
multi-process server (plain Python). ``layout``: the layout header of chunks (pure Python)."""
