"""Callers of `verify_batch` for RL and batch work: the reward service and its server, TRL and
verl reward functions, batch files."""
