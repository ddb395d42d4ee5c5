"""Everything that owns tasks, channels, cancel scopes and deadlines."""
