"""The operating system's side of a run: namespaces, mounts, cgroups, limits and the sandboxes
(the runs' and the compiler's) built from them."""
