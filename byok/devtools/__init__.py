"""Developer tools that ship with byok (the Cursor client simulator)."""
