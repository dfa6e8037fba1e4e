"""Execute notebooks/explore.ipynb top to bottom with nbclient (what CI runs).

    python notebooks/run_notebook.py [--workspace ./ks-data] [--dataset NAME] [--version vN]
                                     [--out executed.ipynb] [--timeout 300]

The parameters reach the notebook through KS_WORKSPACE / KS_DATASET / KS_VERSION; the kernel
runs in the repository root so `./ks-data` means the default build output. Exits non-zero
(with the failing cell's error) when any cell fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "explore.ipynb"


def run_notebook(workspace: str | Path = "./ks-data", dataset: str = "", version: str = "",
                 out: Path | None = None, timeout: int = 300, cwd: Path | None = None
                 ) -> nbformat.NotebookNode:
    """Execute the notebook with these parameters; return the executed notebook."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # The parameters go to the kernel's environment only, not to this process's.
    env = {**os.environ, "KS_WORKSPACE": str(workspace), "KS_DATASET": dataset,
           "KS_VERSION": version}
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd or HERE.parent)}})
    client.execute(env=env)
    if out is not None:
        nbformat.write(nb, out)
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", default="./ks-data")
    parser.add_argument("--dataset", default="")
    parser.add_argument("--version", default="")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()
    try:
        run_notebook(args.workspace, args.dataset, args.version, args.out, args.timeout)
    except CellExecutionError as exc:
        print(f"notebook failed: {exc}", file=sys.stderr)
        return 1
    print(f"executed {NOTEBOOK.name}" + (f" -> {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
