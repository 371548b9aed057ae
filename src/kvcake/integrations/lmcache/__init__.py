"""kvcake as LMCache's remote storage (docs/integrations/lmcache.md).

``connector`` imports LMCache, so it is loaded only by LMCache itself (its plugin config names
``kvcake.integrations.lmcache.connector``), in the LMCache venv; ``layout`` is pure Python."""
