"""Provider adapters: sans-IO request builders and stream parsers, plus the httpx runner."""
