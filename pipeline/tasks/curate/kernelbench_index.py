"""Benchmark fingerprints for decontamination: KernelBench levels 1-4 shipped, any folder on demand.

A fingerprint keeps no source text: the aten op sequence of the forward (traced on meta tensors,
`pipeline.tasks.curate.benchmark_trace`, the same first-use order as `Task.op_inventory`), hashes of the
normalized token n-grams of the computation (names renamed, numbers zeroed), a hash of the
AST op signature, and the input shapes. A task matches a benchmark file by n-gram overlap (where
both were traced, only if they also run similar compute ops), by the same compute-op sequence,
or, where a side has no trace, by the same AST op signature. A match whose task runs a single
compute op (a lone ReLU, a lone matmul), or two ops with neither the same input shapes nor
shared text (first-use order cannot tell Linear+ReLU from an MLP), is generic: reported as an
overlap and kept unless `tasks.decontaminate_generic` is `reject`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.tasks.curate.fingerprint import computation_ngrams, op_signature
from verifier.isolation.sandbox import network_namespace_available, scrubbed_env

INDEX_VERSION = 1
KERNELBENCH_REPO = "https://github.com/ScalingIntelligence/KernelBench"
KERNELBENCH_COMMIT = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
KERNELBENCH_LEVELS = ("level1", "level2", "level3", "level4")
SHIPPED_INDEX = Path(__file__).parent / "data" / "kernelbench_fingerprints.json"
BUILTIN = "kernelbench"  # the name in `tasks.decontaminate_against` for the index above
# aten ops that move, view or allocate data: not part of what a kernel computes
LAYOUT_OPS = frozenset(
    f"aten.{op}" for op in (
        "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "t", "transpose",
        "permute", "contiguous", "clone", "detach", "alias", "unsqueeze", "squeeze", "flatten",
        "_to_copy", "to", "copy_", "lift_fresh", "empty", "empty_like", "empty_strided", "zeros",
        "zeros_like", "ones", "ones_like", "full", "full_like", "new_empty", "new_zeros",
        "new_ones", "new_full", "slice", "select", "split", "split_with_sizes", "unbind",
        "as_strided", "fill_", "zero_", "arange", "_local_scalar_dense", "scalar_tensor",
        "lift_fresh_copy", "unfold", "expand_as", "view_as", "narrow", "chunk"))


class BenchmarkIndexError(ValueError):
    """A fingerprint index cannot be read or built; the message names the file and reason."""


def _gram_hash(gram: str) -> int:
    return int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=6).digest(), "big")


def compute_ops(ops: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The compute ops of an aten op sequence (layout, view and allocation ops dropped)."""
    return tuple(op for op in ops if op not in LAYOUT_OPS)


@dataclass
class Fingerprint:
    """One benchmark file, without its text."""

    name: str  # path inside the benchmark: level1/19_ReLU.py
    grams: list[int]  # hashed normalized n-grams of the computation
    ops: list[str]  # aten ops of the forward in first-use order ([] when untraced)
    ast_ops: str  # hash of the AST op signature ("" when none)
    shapes: list[list[int]]  # input shapes as the file states them
    trace: str  # meta | cpu-small [(stand-in: <checkpoint> ...)] | none: <why>

    @property
    def level(self) -> str:
        return self.name.split("/", 1)[0]


@dataclass
class FingerprintIndex:
    benchmark: str
    source: str  # repo@commit or a folder
    ngram: int
    entries: list[Fingerprint] = field(default_factory=list)
    version: int = INDEX_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str, where: str) -> FingerprintIndex:
        try:
            data = json.loads(text)
            if data.get("version") != INDEX_VERSION:
                raise BenchmarkIndexError(f"{where}: index version {data.get('version')!r}, "
                                  f"expected {INDEX_VERSION}")
            entries = [Fingerprint(**e) for e in data.pop("entries")]
            return cls(entries=entries, **data)
        except (ValueError, TypeError, KeyError) as exc:
            raise BenchmarkIndexError(f"{where}: not a fingerprint index ({exc})") from None

    @functools.cached_property
    def _lookup(self) -> tuple[dict[int, list[int]], dict[tuple[str, ...], list[int]],
                               dict[str, int]]:
        grams: dict[int, list[int]] = {}
        ops: dict[tuple[str, ...], list[int]] = {}
        ast_ops: dict[str, int] = {}
        for i, e in enumerate(self.entries):
            for g in e.grams:
                grams.setdefault(g, []).append(i)
            if compute_ops(e.ops):
                ops.setdefault(compute_ops(e.ops), []).append(i)
            if e.ast_ops:
                ast_ops.setdefault(e.ast_ops, i)
        return grams, ops, ast_ops


@dataclass
class Match:
    """Why a task overlaps a benchmark file."""

    kind: str  # ngram | aten | opseq
    benchmark: str
    entry: str
    overlap: float  # shared n-grams / the task's n-grams
    generic: bool  # one compute op, or two without shapes or text in common
    same_shapes: bool

    def describe(self) -> str:
        shapes = ", same input shapes" if self.same_shapes else ""
        return (f"{self.kind} match with {self.benchmark}/{self.entry} "
                f"(n-gram overlap {self.overlap:.2f}{shapes})")


def source_fingerprint(name: str, source: str, ngram: int, ops: list[str],
                       shapes: list[list[int]], trace: str) -> Fingerprint:
    """A fingerprint of one file from its text and its traced ops."""
    grams = sorted({_gram_hash(g) for g in computation_ngrams(source, ngram)})
    sig = op_signature(source)
    return Fingerprint(name, grams, list(ops), _hash(sig) if sig else "", shapes, trace)


@functools.lru_cache(maxsize=8)
def boilerplate_grams(ngram: int) -> frozenset[int]:
    """Hashed n-grams of constructors that only store their arguments (shared by most files)."""
    out: set[int] = set()
    for k in range(9):
        args = [f"p{i}" for i in range(k)]
        body = "".join(f"        self.p{i} = p{i}\n" for i in range(k))
        src = ("import torch.nn as nn\n\n\nclass Model(nn.Module):\n"
               f"    def __init__({', '.join(['self', *args])}):\n"
               f"        super().__init__()\n{body}\n    def forward(self, x):\n"
               "        return x\n")
        out |= {_gram_hash(g) for g in computation_ngrams(src, ngram)}
        out |= {_gram_hash(g) for g in computation_ngrams(
            src.replace("super().__init__()", "super(Model, self).__init__()"), ngram)}
    return frozenset(out)


def _hash(sig: tuple[str, ...]) -> str:
    return hashlib.sha256("\x1f".join(sig).encode()).hexdigest()[:16]


def match_task(source: str, op_inventory: list[str], shapes: list[list[int]],
               index: FingerprintIndex, threshold: float) -> Match | None:
    """The strongest overlap of one task with `index` (aten ops, then n-grams, then AST)."""
    grams_of, ops_of, ast_of = index._lookup
    boiler = boilerplate_grams(index.ngram)
    mine = {_gram_hash(g) for g in computation_ngrams(source, index.ngram)} - boiler
    ops = compute_ops(op_inventory)
    sig = op_signature(source)
    generic = len(ops) <= 1 if ops else len(sig) <= 1
    hits: dict[int, int] = {}
    for g in mine:
        for i in grams_of.get(g, ()):
            hits[i] = hits.get(i, 0) + 1

    def found(kind: str, i: int) -> Match:
        e = index.entries[i]
        overlap = hits.get(i, 0) / len(mine) if mine else 0.0
        return Match(kind, index.benchmark, e.name, overlap, generic,
                     bool(shapes) and shapes == e.shapes)

    def agrees(i: int) -> bool:
        # a short task shares its boilerplate (`self.v0 = a0`) with many files that compute
        # something else: where both sides were traced, they must also run similar ops; else
        # the shared text must be a large part of the benchmark file too (a copy, not a part)
        theirs = set(compute_ops(index.entries[i].ops))
        if ops and theirs:
            return len(set(ops) & theirs) / len(set(ops) | theirs) >= 0.5
        return hits[i] >= threshold * 0.5 * len(set(index.entries[i].grams) - boiler)

    if ops and ops in ops_of:
        # several files run the same ops (L2 and Frobenius norm): the one with the task's
        # shapes, then the most shared text
        match = found("aten", max(ops_of[ops], key=lambda i: (
            bool(shapes) and shapes == index.entries[i].shapes, hits.get(i, 0), -i)))
        # first-use order drops repeats: a Linear+ReLU pair has the signature of a 3-layer MLP,
        # so a two-op match needs the same input shapes or shared text to count
        if len(ops) == 2 and not (match.same_shapes or match.overlap >= threshold / 2):
            match.generic = True
        return match
    for best in sorted(hits, key=lambda i: (-hits[i], i)):
        if hits[best] / len(mine) < threshold:
            break
        if agrees(best):
            return found("ngram", best)
    # the AST signature (layers and calls, no operators) only where a side has no trace
    if sig and _hash(sig) in ast_of and not (ops and index.entries[ast_of[_hash(sig)]].ops):
        return found("opseq", ast_of[_hash(sig)])
    return None


# --- building an index --------------------------------------------------------------------------


def _tracer_cmd(timeout_s: float) -> list[str]:
    cmd = [sys.executable, "-m", "pipeline.tasks.curate.benchmark_trace", str(timeout_s)]
    if network_namespace_available():
        cmd = [shutil.which("unshare") or "unshare", "-rn", *cmd]
    return cmd


def trace_files(files: dict[str, str], timeout_s: float = 30.0) -> dict[str, dict]:
    """name -> {ops, shapes, trace} for every file, traced in a sandboxed child process."""
    if not files:
        return {}
    root = Path(__file__).resolve().parents[3]  # the repository (PYTHONPATH of the child)
    jobs = "".join(json.dumps({"name": n, "source": s}) + "\n" for n, s in files.items())
    with tempfile.TemporaryDirectory(prefix="ks-bench-trace-") as work:
        proc = subprocess.run(
            _tracer_cmd(timeout_s), input=jobs, capture_output=True, text=True, cwd=work,
            env=scrubbed_env({"PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1",
                              "TRANSFORMERS_OFFLINE": "1"}),
            timeout=60.0 + (timeout_s + 5.0) * len(files))
    out = {}
    for line in proc.stdout.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        out[rec.pop("name")] = rec
    missing = [n for n in files if n not in out]
    for n in missing:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no answer"]
        out[n] = {"ops": [], "shapes": [], "trace": f"none: tracer: {tail[0][:160]}"}
    return out


def benchmark_files(folder: Path, levels: tuple[str, ...] | None = None) -> dict[str, str]:
    """Relative name -> text of the `.py` files under `folder` (only `levels` when given)."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).as_posix()
        if levels and rel.split("/", 1)[0] not in levels:
            continue
        try:
            out[rel] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return out


def build_index(benchmark: str, source: str, files: dict[str, str], ngram: int,
                timeout_s: float = 30.0) -> FingerprintIndex:
    """Fingerprint `files` (name -> text): traced in a sandbox, hashed, no text kept."""
    # a file that loads pretrained weights (KernelBench level 4) is traced with an offline
    # stand-in of the checkpoint's architecture (`pipeline.tasks.curate.pretrained_standins`)
    traces = trace_files(files, timeout_s)
    entries = [source_fingerprint(n, text, ngram, traces[n]["ops"], traces[n]["shapes"],
                                  traces[n]["trace"]) for n, text in files.items()]
    return FingerprintIndex(benchmark, source, ngram, entries)


def clone_at(repo: str, commit: str, dest: Path) -> Path:
    """`repo` (URL, file:// or a local path) checked out at `commit` into `dest`."""
    def git(*args: str, cwd: Path | None = None) -> None:
        res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=600, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        if res.returncode != 0:
            raise BenchmarkIndexError(f"{repo}: git {args[0]} failed: "
                              f"{(res.stderr.strip().splitlines() or ['?'])[-1]}")

    git("clone", "--quiet", "--no-checkout", repo, str(dest))
    git("checkout", "--quiet", commit, cwd=dest)
    return dest


def fetch_kernelbench(out: Path, repo: str = KERNELBENCH_REPO, commit: str = KERNELBENCH_COMMIT,
                      ngram: int = 5, timeout_s: float = 30.0) -> FingerprintIndex:
    """Rebuild the KernelBench index from `repo` at `commit` and write it to `out`."""
    with tempfile.TemporaryDirectory(prefix="ks-kernelbench-") as tmp:
        checkout = clone_at(repo, commit, Path(tmp) / "KernelBench")
        folder = checkout / "KernelBench"
        if not folder.is_dir():
            raise BenchmarkIndexError(f"{repo}@{commit}: no KernelBench/ folder")
        files = benchmark_files(folder, KERNELBENCH_LEVELS)
        if not files:
            raise BenchmarkIndexError(f"{repo}@{commit}: no level1-4 files under KernelBench/")
        index = build_index(BUILTIN, f"{repo}@{commit}", files, ngram, timeout_s)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_text(index.to_json(), encoding="utf-8")
    tmp_out.replace(out)
    return index


# --- resolving `tasks.decontaminate_against` ----------------------------------------------------


@functools.lru_cache(maxsize=16)
def _load_file(path: str, mtime: float) -> FingerprintIndex:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchmarkIndexError(f"{p}: cannot read fingerprint index ({exc})") from None
    return FingerprintIndex.from_json(text, str(p))


def load_index_file(path: Path) -> FingerprintIndex:
    return _load_file(str(path.resolve()), path.stat().st_mtime if path.exists() else 0.0)


@functools.lru_cache(maxsize=16)
def _folder_index(folder: str, stamp: tuple, ngram: int) -> FingerprintIndex:
    return build_index(Path(folder).name, folder, benchmark_files(Path(folder)), ngram)


def folder_index(folder: Path, ngram: int) -> FingerprintIndex:
    """A folder's fingerprints (cached in-process until a file in it changes)."""
    stamp = tuple((str(p), p.stat().st_mtime_ns) for p in sorted(folder.rglob("*.py")))
    return _folder_index(str(folder.resolve()), stamp, ngram)


def resolve_indexes(entries: list[str], ngram: int, benchmark_dir: Path | None = None
                    ) -> list[FingerprintIndex]:
    """One index per `tasks.decontaminate_against` entry: `kernelbench` (a fetched index in
    `benchmark_dir` when present, else the shipped one), an index `.json`, or a folder."""
    out = []
    for entry in entries:
        if entry == BUILTIN:
            fetched = benchmark_dir / f"{BUILTIN}.json" if benchmark_dir else None
            out.append(load_index_file(fetched if fetched and fetched.is_file()
                                       else SHIPPED_INDEX))
            continue
        path = Path(entry)
        if path.is_file() and path.suffix == ".json":
            out.append(load_index_file(path))
        elif path.is_dir():
            out.append(folder_index(path, ngram))
        else:
            raise BenchmarkIndexError(f"tasks.decontaminate_against: {entry}: neither `{BUILTIN}`, "
                              "an index .json nor a folder")
    return out
