"""Cursor tools: one registry, one path per tool (model name -> UI record -> one transport -> result)."""
