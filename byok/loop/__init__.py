"""The agent loop (sans-IO): values in, values out; no I/O, no clock, no trio."""
