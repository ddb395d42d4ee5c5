"""Cursor dialect (sans-IO): protobuf <-> loop values, prompting, checkpoints, usage."""
