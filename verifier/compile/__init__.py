"""Building candidates' extensions: batched, namespaced, sandboxed, cached, load-checked."""
