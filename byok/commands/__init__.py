"""The `byok` subcommands other than the parser itself (byok/cli.py), one module each."""
