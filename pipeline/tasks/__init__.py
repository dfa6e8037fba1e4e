"""RawModule -> Task: carve, probe, curate, annotate, reasoning, task files."""
