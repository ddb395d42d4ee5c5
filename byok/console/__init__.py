"""The console's non-HTTP parts: the entries it makes (providers, models, aliases), how they merge
with the config file's (catalog.py), the key that encrypts provider keys at rest, and the token
the control API asks for. The routes are in byok/http/console_*.py, the pages in ui/."""
