"""HTTP plumbing: Connect framing, the upstream forwarder and the server bootstrap."""
