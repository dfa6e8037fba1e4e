"""Running candidates: the worker that runs one, the execution slots (sandboxed children,
persistent GPU workers) and the fork server."""
