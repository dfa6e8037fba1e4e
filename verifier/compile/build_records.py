"""What a build is: its result and context records, the key of the toolchain every cache entry
lives under, and what specs sharing a translation unit must have in common."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from verifier.backends import Backend
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.build_cause import environment_cause
from verifier.compile.unit_sources import includes_of
from verifier.isolation.sandbox import Launcher, SpawnLauncher

# Changes with what a build means (headers, flags): cached outcomes of older rules, failures
# included, are not reused. "": the first rules; "|2": device headers and the toolkit's include
# folder for functions=None modules and CUDA host units, as torch's load_inline has them;
# "|3": specs share a unit only when they include the same headers.
# "|4": each candidate's directives read as the compiler reads them (verifier.checks.preprocess), a
# candidate the unit cannot neutralise built alone, a failure final only when built alone.
BUILD_RULES = "|4"


REFUSED = "build refused:"  # a log that begins so: the build read what it must not (no output)


@dataclass
class BuildResult:
    """The outcome of building one spec."""

    key: str
    ok: bool
    module: str = ""  # PyInit name of the shared object
    path: str = ""  # the shared object
    mode: str = "batch"  # batch: functions are k<key>__<fn>; module: the sources' own module
    log: str = ""  # compiler output for this spec, lines of its sources (see candidate_log)
    seconds: float = 0.0  # this spec's share of the build time
    batch_size: int = 1
    cached: bool = False
    sha256: str = ""  # of the shared object, written by the builder, checked before every load
    # the log names the spec's own source lines; entries without this key were mapped to the
    # lines of the first candidate that had the sources, so their failures are built again
    unit_log: bool = True

    @property
    def refused(self) -> bool:
        """The build was refused for what it reads: a static_reject, not a compile error."""
        return self.log.startswith(REFUSED)

    @property
    def environmental(self) -> str:
        """Why this failure is the environment's, not the spec's text ("" when it is the spec's
        own, or a success): such a failure is never cached (`verifier.compile.build_cause`)."""
        return "" if self.ok else environment_cause(self.log, self.refused)

    def to_entry(self) -> dict:
        return {"module": self.module, "path": self.path, "mode": self.mode}


@dataclass
class BuildContext:
    """Where builds go and how long they may take."""

    backend: Backend
    cache_dir: Path
    timeout_s: float = 600.0
    use_pch: bool = True
    pch_min_specs: int = 3  # build a new PCH only when at least this many specs need it
    check_import: bool = True
    launcher: Launcher = field(default_factory=SpawnLauncher)  # sandboxed runs (load checks)
    load_memory_mb: int = 8192  # address-space limit of the load check (0: none, CUDA hosts)
    light_host: bool = True  # host units try the light headers first (`verifier.compile.host_headers`)

    @property
    def root(self) -> Path:
        """The cache directory of this (backend, torch build, toolchain): see `toolchain_key`."""
        return self.cache_dir / f"{self.backend.name}-{toolchain_key(self.backend)}"


def toolchain_key(backend: Backend) -> str:
    """Hash of the backend, the torch build and the toolchain identity (compiler paths and
    `--version` outputs, fixed flags, arch; cached per process): every cache entry lives under
    it, so a new compiler or torch never loads objects built by the old one."""
    from verifier.backends import torch_identity

    ident = f"{backend.name}\n{torch_identity()}\n{backend.toolchain_id()}\n{BUILD_RULES}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def flags_key(spec: ExtensionSpec) -> tuple:
    """What specs sharing a translation unit must have in common: flags, and the headers they
    include (hoisted to the unit's top, one spec's header would declare names for another that
    torch's load_inline, building it alone, rejects)."""
    return (tuple(spec.extra_cflags), tuple(spec.extra_ldflags), tuple(spec.extra_include_paths),
            tuple(spec.extra_cuda_cflags), spec.no_implicit_headers,
            includes_of(spec.cpp_sources), includes_of(spec.cuda_sources))
