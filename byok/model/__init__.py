"""Canonical values shared by the loop, the Cursor dialect, the providers and the store."""
