"""Batch builds: many candidates' extensions compiled as one translation unit, cached by content.

Each batchable spec's sources are wrapped in `namespace ks_<key>` with their `#include` lines
hoisted to the top and `#line` directives naming the spec's own sources (`<key>/cpp0`), and one
PYBIND11_MODULE binds `k<key>__<fn>` for every spec. Host units include a gcc precompiled header of
`torch/extension.h` built once per (backend, torch version, flags). When a batch fails, the specs
named in the errors are rebuilt alone and the rest rebuilt together (bisection when none is;
`verifier.compile.compile_plan` runs the rebuilds `Builder.build_unit` returns on any free compile
worker), so one bad candidate fails only itself; a failure is final only for a spec built alone,
and cached only when its cause is the spec's text (`build_cause`; the load check's words by who
said them: `verifier.compile.object_import`). No candidate's preprocessor
state reaches another: a unit holds a spec only when `verifier.compile.batch_guard` finds every
directive of it, read as the compiler reads it (`verifier.checks.preprocess`), neutralised (its
macros undefined after it); other specs are built alone. A build whose `-MD` list names a file
outside the allowlist is refused with no compiler output (`REFUSED`); compilers run in
`verifier.isolation.build_sandbox`. Results are cached per spec key in `<cache>/index/`, so a
re-run or a later batch never compiles a spec twice. A spec's log names its own sources' lines
(`cpp_sources[0]:12`: an entry is shared wherever they sit in a file); `candidate_log` maps them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from verifier.backends import BuildUnit
from verifier.checks.extspec import ExtensionSpec
from verifier.compile.artefacts import (  # noqa: F401 - re-exported: callers import them from here
    CACHE_EVENTS,
    ArtefactMismatch,
    copy_for_worker,
    file_sha256,
    record_event,
    sidecar_ok,
    verify_artefact,
)
from verifier.compile.batch_guard import batch_blockers
from verifier.compile.build_reads import unallowed_reads
from verifier.compile.build_records import (  # noqa: F401 - re-exported: callers import them from here
    BUILD_RULES,
    REFUSED,
    BuildContext,
    BuildResult,
    flags_key,
    toolchain_key,
)
from verifier.compile.cache_bound import hold_made, touch
from verifier.compile.host_headers import (
    FULL_HOST_HEADERS,
    LIGHT_HOST_HEADERS,
    light_host_text,
    may_need_full_header,
)
from verifier.compile.landing import Landing
from verifier.compile.load_code import no_load_code
from verifier.compile.object_import import check_import
from verifier.compile.unit_sources import (  # noqa: F401 - re-exported: callers import them from here
    CAND_FILE,
    batch_sources,
    candidate_log,
    includes_of,
    module_sources,
    refusal,
    spec_scans,
)
from verifier.isolation.build_sandbox import SANDBOX_FAILED, BuildSandboxError


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


class Builder:
    """Builds specs into shared objects under the cache, batching where it can."""

    def __init__(self, ctx: BuildContext):
        self.ctx = ctx
        self.root = ctx.root
        (self.root / "index").mkdir(parents=True, exist_ok=True)

    # --- cache -------------------------------------------------------------------------------
    def _index_path(self, key: str) -> Path:
        return self.root / "index" / f"{key}.json"

    def cached(self, spec: ExtensionSpec) -> BuildResult | None:
        try:
            data = json.loads(self._index_path(spec.key).read_text())
            res = BuildResult(**data)
        except (OSError, ValueError, TypeError):
            return None
        if not res.ok and ("unit_log" not in data or res.environmental):  # built again: a log
            return None  # mapped to another candidate's lines, or not its doing (older rules)
        if res.ok and not Path(res.path).is_file():
            return None
        if res.ok and not verify_artefact(res):
            record_event(f"cache entry {spec.key}: {res.path} does not match its hash; rebuilt")
            return None
        touch(self._index_path(spec.key))  # a use: `verifier.compile.cache_bound` evicts by last use
        if res.ok:
            touch(Path(res.path).parent)
        res.cached = True
        res.seconds = 0.0
        return res

    def _store(self, res: BuildResult) -> None:
        if res.environmental:  # not the spec's doing: the next build of it may well succeed
            return record_event(f"{res.key} not cached: {res.environmental}")
        if res.ok and not res.sha256:  # the digest taken when the object was linked
            side = Path(f"{res.path}.sha256")
            res.sha256 = side.read_text().strip() if side.is_file() else file_sha256(res.path)
        path = self._index_path(res.key)
        path.parent.mkdir(parents=True, exist_ok=True)  # `cache_bound.trim` removes it when empty
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        data = {k: v for k, v in res.__dict__.items() if k != "cached"}
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)

    # --- PCH ---------------------------------------------------------------------------------
    def pch_dir(self, cflags: list[str], n_specs: int, log: list[str],
                light: bool = False) -> Path | None:
        """The folder of the PCH (of the light host headers or torch/extension.h) for these
        flags, built here when missing and at least `pch_min_specs` specs need it."""
        if not self.ctx.use_pch:
            return None
        d = self.root / "pch" / _hash(*self.ctx.backend.host_flags(), *cflags,
                                      *(["light"] if light else []))
        if (d / "ks_pch.h.gch").is_file():
            touch(d)
            return d
        if n_specs < self.ctx.pch_min_specs:
            return None
        d.mkdir(parents=True, exist_ok=True)
        lock = d / ".lock"
        try:  # one builder makes the PCH; the others wait for it (a unit without it: ~30 s)
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return self._wait_for_pch(d, lock)
        os.close(fd)
        try:
            # whole or not at all: a builder that took a stale lock may be compiling from it
            part = d / f"ks_pch.h.{os.getpid()}"
            part.write_text(LIGHT_HOST_HEADERS if light else FULL_HOST_HEADERS)
            os.replace(part, d / "ks_pch.h")
            tmp = d / f"tmp{os.getpid()}.gch"
            if self.ctx.backend.compile_pch(d / "ks_pch.h", tmp, cflags, log, self.ctx.timeout_s):
                os.replace(tmp, d / "ks_pch.h.gch")
                return d
            tmp.unlink(missing_ok=True)
            return None
        finally:
            lock.unlink(missing_ok=True)

    def held_pch(self, cflags: list[str], n_specs: int, log: list[str],
                 light: bool = False) -> contextlib.AbstractContextManager[Path | None]:
        """`pch_dir`'s folder, held while the compile that includes it runs: another process's
        trim cannot remove it meanwhile (`verifier.compile.cache_bound.hold`)."""
        return hold_made(lambda: self.pch_dir(cflags, n_specs, log, light), "ks_pch.h.gch")

    def _wait_for_pch(self, d: Path, lock: Path) -> Path | None:
        """The PCH another builder is making, once it is there (None if that build fails)."""
        while not (d / "ks_pch.h.gch").is_file():
            try:
                if time.time() - lock.stat().st_mtime > self.ctx.timeout_s:  # stale
                    lock.unlink(missing_ok=True)
                    return None
            except OSError:  # the other builder finished (or gave up) just now
                return d if (d / "ks_pch.h.gch").is_file() else None
            time.sleep(0.2)
        return d

    def prepare_pch(self, specs: list[ExtensionSpec]) -> None:
        """Build the PCH of every flag group big enough, before parallel builds race for it."""
        groups: dict[tuple, list[ExtensionSpec]] = {}
        for s in specs:
            if s.batchable and not self.cached(s):
                groups.setdefault(flags_key(s), []).append(s)
        for group in groups.values():
            first = group[0]
            cflags = [*first.extra_cflags, *(f"-I{p}" for p in first.extra_include_paths)]
            self.pch_dir(cflags, len(group), [], light=self.ctx.light_host)

    # --- builds ------------------------------------------------------------------------------
    def triage(self, specs: list[ExtensionSpec], results: Landing) -> list[ExtensionSpec]:
        """Land what needs no build (cached, unsupported, device sources on a host backend)
        together, in the caller's order; the specs still to build, each once."""
        todo: dict[str, ExtensionSpec] = {}
        held = results.hold()
        for s in specs:
            if s.key in results or s.key in todo:
                continue
            hit = self.cached(s)
            if hit:
                results[s.key] = hit
            elif s.unsupported:
                results[s.key] = BuildResult(s.key, False, log=s.unsupported)
            elif s.cuda_sources and not self.ctx.backend.supports_device_sources:
                results[s.key] = BuildResult(
                    s.key, False, log=f"cuda_sources cannot be built by the "
                                      f"{self.ctx.backend.name} backend (it needs cuda or musa)")
            else:
                todo[s.key] = s
        results.release(held)
        return list(todo.values())

    def build(self, specs: list[ExtensionSpec],
              on_ready: Callable[[dict[str, BuildResult]], None] | None = None
              ) -> dict[str, BuildResult]:
        """Build all `specs` (any mix of flags and kinds) here, one unit after another; one
        result per spec key. `on_ready` gets results as soon as they are final and stored (good
        specs of a failed unit go on before the bad ones are confirmed alone). Parallel builds:
        `verifier.compile.compile_plan`."""
        results = Landing(self._store, on_ready)
        groups: dict[tuple, list[ExtensionSpec]] = {}
        for s in self.triage(specs, results):
            groups.setdefault((True, flags_key(s)) if s.batchable else (False, s.key),
                              []).append(s)
        for group in groups.values():
            todo: list[tuple[list[ExtensionSpec], float]] = [(group, 0.0)]
            while todo:  # depth first: a failed unit's rebuilds before the next unit
                unit, carried = todo.pop(0)
                todo[:0] = self.build_unit(unit, results, carried)
        return dict(results)

    def build_unit(self, specs: list[ExtensionSpec], results: Landing, carried: float = 0.0
                   ) -> list[tuple[list[ExtensionSpec], float]]:
        """Build `specs` (batchable ones with the same flags, or one that is not) as one unit
        and land what is final; the rebuilds a failure needs, each with the seconds per spec
        already spent on it (`carried`, charged to the spec so compile_s is honest). A spec
        whose directives the unit cannot neutralise (`batch_blockers`) is built alone, and a
        failure is final only for a spec built alone: a batch-mate cannot fail it (its
        `#line` may name another spec) nor leave a failure cached under its key."""
        held = results.hold()
        for s in specs:
            if refusal(s):
                results[s.key] = BuildResult(s.key, False, log=f"{REFUSED} {refusal(s)}",
                                             seconds=carried)
        results.release(held)
        specs = [s for s in specs if s.key not in results]
        if not specs:
            return []
        if len(specs) == 1 and not specs[0].batchable:
            results[specs[0].key] = self._build_one_module(specs[0])
            return []
        if len(specs) > 1:
            alone = self.batch_blockers(specs)
            if alone:
                rest = [s for s in specs if s.key not in alone]
                return [*(([s], carried) for s in specs if s.key in alone),
                        *([(rest, carried)] if rest else [])]
        ok, log, so, module, secs = self._build_batch(specs)
        if ok:
            held = results.hold()  # a unit's specs go on together, in their order
            for s in specs:
                results[s.key] = BuildResult(s.key, True, module, str(so), "batch", "",
                                             secs / len(specs) + carried, len(specs))
            results.release(held)
            return []
        if len(specs) == 1:
            s = specs[0]
            results[s.key] = BuildResult(s.key, False, log=self._spec_log(log, s.key),
                                         seconds=secs + carried)
            return []
        carried += secs / len(specs)
        blamed = {s.key for s in specs if s.key in log}
        if blamed and len(blamed) < len(specs):
            # the rest first (candidates with no error land after one more build), then each
            # blamed spec alone: only its own build may fail it
            return [([s for s in specs if s.key not in blamed], carried),
                    *(([s], carried) for s in specs if s.key in blamed)]
        half = len(specs) // 2
        return [(specs[:half], carried), (specs[half:], carried)]

    def batch_blockers(self, specs: list[ExtensionSpec]) -> dict[str, str]:
        """Spec key -> why it cannot share a unit (`verifier.compile.batch_guard`)."""
        return batch_blockers(specs, self.ctx.backend, self.root, self.ctx.timeout_s)

    def _spec_log(self, log: str, key: str) -> str:
        """The compiler output about this spec (no other spec's lines), its sources named as
        load_inline's arguments (`cpp_sources[0]:12`)."""
        named = re.compile(r"([0-9a-f]{16})/(cpp|cuda)(\d+)\b")
        lines = [ln for ln in log.splitlines() if not ln.startswith("$ ")
                 and all(m.group(1) == key for m in named.finditer(ln))]
        text = named.sub(lambda m: f"{m.group(2)}_sources[{m.group(3)}]", "\n".join(lines))
        return text.replace(f"ks_{key}::", "").replace(f"k{key}__", "")

    def _build_batch(self, specs: list[ExtensionSpec]) -> tuple[bool, str, Path, str, float]:
        t0 = time.monotonic()
        bkey = _hash(*sorted(s.key for s in specs))
        module = f"ks_b{bkey}"
        out_dir = self.root / "builds" / bkey
        so = out_dir / f"{module}.so"
        if so.is_file() and sidecar_ok(so):
            touch(out_dir)
            return True, "", so, module, 0.0
        host, device = batch_sources(specs, module, self.ctx.backend.device_prelude)
        ok, log = self._compile_link(specs[0], out_dir, module, host, device, len(specs))
        if ok and self.ctx.check_import:
            ok, imp = self._check_import(so, module)
            if not ok:
                log += "\n" + imp
                so.unlink(missing_ok=True)
        return ok, log, so, module, time.monotonic() - t0

    def _build_one_module(self, spec: ExtensionSpec) -> BuildResult:
        t0 = time.monotonic()
        module = f"ks_m{spec.key}"
        out_dir = self.root / "builds" / f"m{spec.key}"
        so = out_dir / f"{module}.so"
        host, device = module_sources(spec, self.ctx.backend.device_prelude)
        flags_extra = [f"-DTORCH_EXTENSION_NAME={module}"]
        ok, log = self._compile_link(spec, out_dir, module, host, device, 1, flags_extra)
        if ok and self.ctx.check_import:
            ok, imp = self._check_import(so, module)
            log += "\n" + imp if not ok else ""
        secs = time.monotonic() - t0
        if not ok:
            return BuildResult(spec.key, False, log=self._spec_log(log, spec.key), seconds=secs)
        return BuildResult(spec.key, True, module, str(so), "module", "", secs, 1)

    def _compile_link(self, first: ExtensionSpec, out_dir: Path, module: str, host: str,
                      device: str, n: int, extra: list[str] | None = None) -> tuple[bool, str]:
        out_dir.mkdir(parents=True, exist_ok=True)
        be = self.ctx.backend
        cflags = [*first.extra_cflags, *(f"-I{p}" for p in first.extra_include_paths)]
        log: list[str] = []
        # unique names: another process may be building the same batch into this folder
        tag = f"{os.getpid()}-{threading.get_ident()}"
        (out_dir / f"host-{tag}.cpp").write_text(host)
        objs = [out_dir / f"host-{tag}.o"]
        deps: list[Path] = []  # the -MD lists of the compiles that ran
        try:
            ok = True
            if device:  # first: it needs no PCH, which may still be building meanwhile
                dpath = out_dir / f"device-{tag}{be.device_suffix}"
                dpath.write_text(device)
                objs.append(out_dir / f"device-{tag}.o")
                deps.append(out_dir / f"device-{tag}.d")
                ok = be.compile_unit(BuildUnit(dpath, "device"), objs[1],
                                     [*first.extra_cuda_cflags, *(extra or []), "-MD", "-MF",
                                      str(deps[-1])], None, log, self.ctx.timeout_s)
            if ok:
                ok = self._compile_host(out_dir / f"host-{tag}.cpp", objs[0], cflags,
                                        [*cflags, *(extra or [])], n, deps, log)
        except ValueError as exc:
            return False, str(exc)
        if any(SANDBOX_FAILED.search(chunk) for chunk in log):  # not the candidate's doing:
            raise BuildSandboxError("the compiler's sandbox failed: "  # never cached
                                    + next(c for c in log if SANDBOX_FAILED.search(c))[-300:])
        if ok and n > 1:  # one object for many: nobody's code may run when it is loaded
            ok, log = no_load_code(objs, log)
        read = unallowed_reads(log, deps, [str(out_dir), str(self.root / "pch")],
                               first.extra_include_paths, be.host_compiler(), failed=not ok)
        for d in deps:
            d.unlink(missing_ok=True)
        if read:  # none of the compiler's output: it may quote the file
            for o in objs:
                o.unlink(missing_ok=True)
            return False, (f"{REFUSED} it read {', '.join(read[:5])}: outside the toolchain's, "
                           "torch's, CUDA's and Python's headers and its own sources")
        if ok:
            tmp = out_dir / f".{module}.so.{tag}.tmp"
            ok = be.link(objs, tmp, first.extra_ldflags, log, self.ctx.timeout_s)
            if ok:
                digest = file_sha256(tmp)
                (out_dir / f"{module}.so.sha256.{tag}").write_text(digest)
                os.replace(out_dir / f"{module}.so.sha256.{tag}", out_dir / f"{module}.so.sha256")
                os.replace(tmp, out_dir / f"{module}.so")
        for o in objs:
            o.unlink(missing_ok=True)
        return ok, "\n".join(log)

    def _compile_host(self, src: Path, obj: Path, cflags: list[str], flags: list[str], n: int,
                      deps: list[Path], log: list[str]) -> bool:
        """The host unit: with the light headers on their PCH first, as written (torch/
        extension.h's PCH) when that fails on a name the light set may lack; every compile's
        -MD list is added to `deps`."""
        be, text = self.ctx.backend, src.read_text()
        light = light_host_text(text) if self.ctx.light_host else None
        if light is not None:
            lsrc = src.with_name(f"{src.stem}.light{src.suffix}")
            lsrc.write_text(light)
            deps.append(lsrc.with_suffix(".d"))
            trial: list[str] = []
            with self.held_pch(cflags, n, trial, light=True) as pch:
                ok = be.compile_unit(BuildUnit(lsrc, "host"), obj, [*flags, "-MD", "-MF",
                                     str(deps[-1])], pch, trial, self.ctx.timeout_s)
            lsrc.unlink(missing_ok=True)
            text = "\n".join(trial)
            if ok or "timed out" in text or not may_need_full_header(text):
                log.extend(chunk.replace(lsrc.name, src.name) for chunk in trial)
                return ok
            log.extend(c for c in trial if c.startswith("$ "))  # its reads are checked too
            log.append("(light host headers failed on a torch name; building as written)")
        deps.append(src.with_suffix(".d"))
        with self.held_pch(cflags, n, log) as pch:
            return be.compile_unit(BuildUnit(src, "host"), obj, [*flags, "-MD", "-MF",
                                   str(deps[-1])], pch, log, self.ctx.timeout_s)

    def _check_import(self, so: Path, module: str) -> tuple[bool, str]:
        """The load check of a built object (`verifier.compile.object_import`)."""
        return check_import(self.ctx, so, module)
