"""kvcake's implementation of Mooncake's pure-Python ``mooncake.structured_object_store`` and
``mooncake.dataproto_catalog`` (public surfaces: ``..structured_object_store``,
``..dataproto_catalog``)."""
