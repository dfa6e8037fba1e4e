"""C++ forms that hide a call from the rules on the source text (red-team round 4).

`verifier.checks.static.check_cpp` matches `at::relu(`, `py::module_::import`, `fopen(`: a namespace
alias (`namespace K = at; K::relu(x)`), a using-declaration or -directive (`using at::relu;`), a
pointer (`auto op = &::fopen; op(...)`) call the same functions under other spellings, and the
dispatcher's thread-local state (excluded dispatch keys, record-function guards) decides what the
verifier's trace and profiler see of a call at all; a TORCH_LIBRARY_IMPL for torch's own
operators replaces them in every process that loads the object. Here the aliases are written out
before the rules run, and the other forms are findings of their own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

_ALIAS = re.compile(r"\bnamespace\s+(\w+)\s*=\s*((?:::\s*)?\w+(?:\s*::\s*\w+)*)\s*;")
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# `using namespace torch::indexing;` (Slice, None) is how honest code indexes; the rest bring
# ATen's or pybind11's functions in under bare names no rule can tell from the candidate's own
_USING_NAMESPACE = re.compile(
    r"\busing\s+namespace\s+((?:::\s*)?(?:at|torch|c10|pybind11|py)\b(?:\s*::\s*\w+)*)\s*;")
_USING_DECL = re.compile(r"\busing\s+(?:::\s*)?(at|torch)\s*::\s*((?:\w+\s*::\s*)*)(\w+)\s*;")
_FN_REF = re.compile(r"&\s*(?:::\s*)?(at|torch)\s*::\s*((?:\w+\s*::\s*)*)(\w+)\b(?!\s*[(<])|"
                     r"=\s*(?:::\s*)?(at|torch)\s*::\s*((?:\w+\s*::\s*)*)(\w+)\s*;")
# libc functions with names nothing honest shares: any mention is a use (a call, a pointer, a
# decltype); names honest code reuses (`open`, `system`, `kill`) only when their address is taken
_LIBC_NAMED = re.compile(
    r"(?<![.\w>])\b(fopen|fopen64|freopen|fdopen|popen|dlopen|dlmopen|dlsym|dlvsym|getenv|"
    r"secure_getenv|setenv|putenv|syscall|ptrace|execv|execve|execvp|execvpe|execl|execlp|"
    r"execle|fexecve|vfork|mmap|mmap64|mprotect|openat|openat2|prctl|setrlimit|prlimit|"
    r"prlimit64|unshare|setns|pidfd_open|process_vm_writev|process_vm_readv|getauxval|sigaction|"
    r"posix_spawn|posix_spawnp|sched_setaffinity|personality|chroot|opendir|readlink|"
    r"__libc_dlsym|__libc_dlopen_mode)\b")
_LIBC_ADDRESS = re.compile(
    r"&\s*(?:::\s*)?(?:std\s*::\s*)?(open|open64|creat|system|kill|tgkill|socket|connect|"
    r"remove|unlink|rename|signal|raise|clone|fork|mount|write|read|truncate|ftruncate)\b")
# what decides whether the verifier's dispatcher trace and profiler see an op
_DISPATCH_STATE = re.compile(
    r"\b(ExcludeDispatchKeyGuard|IncludeDispatchKeyGuard|ForceDispatchKeyGuard|"
    r"RecordFunctionGuard|DisableRecordFunctionGuard|RecordFunctionCallbacks\w*|"
    r"addThreadLocalCallback|addGlobalCallback|removeCallback|clearCallbacks|"
    r"clearThreadLocalCallbacks|clearGlobalCallbacks|enableRecordFunction|"
    r"tls_set_dispatch_key_\w+|tls_local_dispatch_key_set|_force_tls_local_dispatch_key_set|"
    r"LocalDispatchKeySet|PythonTLSSnapshot|PythonDispatcher|ThreadLocalStateGuard|"
    r"ThreadLocalState|AutoDispatchBelow\w*|AutoDispatchSkipFunctionalize|Dispatcher|"
    r"DispatchKey|DispatchKeySet|TorchDispatchModeTLS|PythonModeTLS|DispatchKeyExtractor|"
    r"OperatorHandle|callBoxed|redispatch\w*)\b")


# an operator library's registrations run when the object loads, in every process that loads
# it (a batch unit's object: every batch-mate's worker): kernels for torch's own operators there
_LIBRARY = re.compile(r"\b(TORCH_LIBRARY_IMPL|TORCH_LIBRARY_FRAGMENT|TORCH_LIBRARY)\s*\(\s*(\w+)")
_REGISTRY = re.compile(r"\b(RegisterOperators|registerKernel|registerFallback|"
                       r"TORCH_LIBRARY_IMPL_init|TORCH_LIBRARY_init|TorchLibraryInit)\b")


def resolve_aliases(src: str) -> str:
    """`src` with each use of a namespace alias (`K::relu`) written as what it names."""
    aliases = {m.group(1): re.sub(r"\s+", "", m.group(2)).lstrip(":")
               for m in _ALIAS.finditer(src)}
    if not aliases:
        return src
    for _ in range(len(aliases)):  # an alias of an alias names the end of the chain
        for name, target in list(aliases.items()):
            head = target.split("::")[0]
            if head in aliases and head != name:
                aliases[name] = aliases[head] + target[len(head):]
    use = re.compile(r"(?<![\w:])(" + "|".join(map(re.escape, aliases)) + r")\s*::")
    return use.sub(lambda m: aliases[m.group(1)] + "::", src)


def hidden_forms(clean: str, allowed: frozenset[str], is_aten_op: Callable[[str], bool]
                 ) -> Iterator[tuple[str, str, int]]:
    """(rule, message, offset in `clean`) of every hiding form in comment-free C++ `clean`;
    `allowed` are the at::/torch:: names the compute rule lets through."""
    text = _STRING.sub(lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', clean)
    for m in _USING_NAMESPACE.finditer(text):
        target = re.sub(r"\s+", "", m.group(1)).lstrip(":")
        if target != "torch::indexing":
            yield ("cpp_torch_compute", f"using namespace {target}: its functions would be "
                   "called under bare names no rule can tell from the candidate's own",
                   m.start())
    for m in _USING_DECL.finditer(text):
        if m.group(3) not in allowed:
            yield ("cpp_torch_compute", f"using {m.group(1)}::{m.group(2)}{m.group(3)} brings an "
                   "ATen function in under a bare name", m.start())
    for m in _FN_REF.finditer(text):
        ns, name = (m.group(1), m.group(3)) if m.group(1) else (m.group(4), m.group(6))
        if name not in allowed and is_aten_op(name):
            yield ("cpp_torch_compute", f"a pointer to {ns}::{name}: ATen compute called "
                   "through a function pointer", m.start())
    for m in _LIBC_NAMED.finditer(text):
        yield ("escape", f"{m.group(1)} (file/process/network access from C++, by any "
               "spelling: a call, a pointer or a type)", m.start())
    for m in _LIBC_ADDRESS.finditer(text):
        yield ("escape", f"the address of {m.group(1)} (file/process/network access from C++ "
               "through a pointer)", m.start())
    own = {m.group(2) for m in _LIBRARY.finditer(text) if m.group(1) == "TORCH_LIBRARY"}
    for m in _LIBRARY.finditer(text):
        if m.group(1) != "TORCH_LIBRARY" and m.group(2) not in own:
            yield ("op_registration", f"{m.group(1)}({m.group(2)}, ...) registers kernels for "
                   "operators this code does not define (torch's own: in every process that "
                   "loads the object, a batch-mate's included)", m.start())
    for m in _REGISTRY.finditer(text):
        yield ("op_registration", f"{m.group(1)}: operator registration outside TORCH_LIBRARY "
               "of the candidate's own namespace", m.start())
    for m in _DISPATCH_STATE.finditer(text):
        yield ("dispatch_tamper", f"{m.group(1)}: the dispatcher's keys, guards and callbacks "
               "decide what the verifier's trace sees; kernels have no use for them", m.start())
