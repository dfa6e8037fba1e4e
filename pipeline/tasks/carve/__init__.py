"""Carve: cut one nn.Module class out of a source file into a standalone KernelBench-style module
(its closure of names, helpers of sibling files, a concrete config stand-in, torch-only shims)."""
