"""Judging a run from outside the candidate's process: references, output comparison, the clock
and its timed windows, the GPU referee, performance and the reward."""
