"""The proxy process (``kvcake proxy``): the OpenAI API, the conductor's live state, routing, the dashboard."""
