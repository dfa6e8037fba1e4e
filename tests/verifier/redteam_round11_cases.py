"""Red-team round 11: candidate sources and build logs for tests/verifier/test_redteam_round11.py.

A failed build is cached only when its cause is the candidate's own text
(`verifier.compile.build_cause`); a batch whose every candidate fails alike for a reason that
names the environment stops the pipeline's verify stage (`verifier.isolation.sandbox.
common_failure`); a trial's output equal to an earlier trial's is a `cheat` (a kept result,
`verifier.judge.decide.CACHED_RESULT`). Each can be said by a candidate about itself.
"""

from __future__ import annotations

# --- the candidate's own build failure, worded as the host's ----------------------------------
# Each `(name, cpp source)` fails to build for its own text alone; the log line the builder kept
# of it (gcc 13, the cpu backend) names the environment, so the failure was never cached: built
# again on every request that sends it (a compile pool kept busy for free), and blamed on the
# host in the verdict's log.
OWN_FAILURES = {
    # the directive's text in the compiler's words
    "error_directive": ("int twice(int x) { return 2 * x; }\n"
                        "#error No space left on device\n"),
    # a static_assert's message
    "static_assert": ('int twice(int x) { return 2 * x; }\n'
                      'static_assert(sizeof(int) == 3, "Killed signal terminated program cc1plus");'
                      "\n"),
    # a warning's text beside a real error of its own
    "warning_directive": ("#warning cannot execute the compiler\n"
                          "int twice(int x) { return 2 * x }\n"),
    # a name the import fails on: the builder's precompiled header's (ks_pch)
    "symbol_name": "int ks_pch(int);\nint twice(int x) { return ks_pch(x); }\n",
}
# the lines each left in its spec's log (`Builder._spec_log`), as measured on main at 258f195;
# the symbol's namespace is the spec's key (`ks_<key>`), any here
OWN_FAILURE_LOGS = {
    "error_directive": "cpp_sources[0]:2:2: error: #error No space left on device",
    "static_assert": ("cpp_sources[0]:2:27: error: static assertion failed: Killed signal "
                      "terminated program cc1plus\n"
                      "cpp_sources[0]:2:27: note: the comparison reduces to ‘(4 == 3)’"),
    "warning_directive": ("cpp_sources[0]:1:2: warning: #warning cannot execute the compiler "
                          "[-Wcpp]\ncpp_sources[0]: In function ‘int twice(int)’:\n"
                          "cpp_sources[0]:2:32: error: expected ‘;’ before ‘}’ token"),
    "symbol_name": ("import of the built extension failed: ImportError: /tmp/run/"
                    "ks_b2af8d7272d590e45.so: undefined symbol: _ZN19ks_985360233ca25c4c6ks_pchEi"),
}
# what the host does to a build, in the compiler's and the builder's words: still environmental
HOST_FAILURE_LOGS = {
    "pch_trimmed": ("<command-line>: fatal error: ks_pch.h: No such file or directory\n"
                    "compilation terminated."),
    "oom_killed": "g++: fatal error: Killed signal terminated program cc1plus\n"
                  "compilation terminated.",
    "header_missing": ("cpp_sources[0]:1:10: fatal error: cub/cub.cuh: No such file or "
                       "directory\ncompilation terminated."),
    "header_unreadable": ("cpp_sources[0]:1:10: fatal error: torch/extension.h: Permission "
                          "denied\ncompilation terminated."),
    "compiler_crash": ("cpp_sources[0]:9:1: internal compiler error: Segmentation fault\n"
                       "0x7f3a libc.so.6"),
    "timed_out": "build error: the compiler timed out after 600 s",
}
# a static initializer that writes the host's words on the load check's stderr and exits: the
# load check's process is the candidate's, so its last error line is the candidate's to write
FORGED_IMPORT = r'''#include <cstdio>
#include <cstdlib>
static int forged = (std::fputs("OSError: [Errno 28] No space left on device\n", stderr),
                     std::fflush(stderr), std::_Exit(1), 0);
int twice(int x) { return 2 * x; }
'''

# --- a batch that fails alike, by the candidates' own doing -------------------------------------
# forward raises what a broken sandbox raises (PermissionError, FileNotFoundError): three such
# candidates of a batch (an LLM's samples that read a weights file fail so without any intent)
RAISE_FORWARD = ('raise PermissionError(13, "Permission denied", "/opt/weights.bin")'
                 "  # sample {i}")
# the extension prints the words of an interpreter the sandbox hides and ends its process: the
# verdict's error is the one a broken environment gives (`worker exited with code 1: ...`)
DIE_CPP = r"""
#include <cstdio>
#include <cstdlib>
torch::Tensor relu_fwd(torch::Tensor x) {
    std::fputs("FileNotFoundError: [Errno 2] No such file or directory: "
               "'/tmp/venv/bin/python'\n", stderr);
    std::fflush(stderr);
    std::_Exit(1);
    return x;
}
"""

# --- a constant output: a wrong kernel, not a kept result --------------------------------------
# a per-row flag: does the row hold a value above 1.5 (one bool per row of 3 values)
FLAG_TASK = '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return (x > 1.5).any(dim=1)


def get_inputs():
    return [torch.randn(2, 3)]


def get_init_inputs():
    return []
'''

# --- candidate code the build stage runs, outside the compile-core partition -------------------
# The candidate's module runs to collect its load_inline calls (computed arguments) and its
# object's static initializers run in the load check: each says on which cpus it ran, the first
# in its extension's name, the second in the import's failure
CPUS_MODULE = """import os
import torch
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="cpus_" + "_".join(map(str, sorted(os.sched_getaffinity(0)))),
                  cpp_sources="int twice(int x) { return 2 * x; }", functions=["twice"])
"""
CPUS_STATIC = r"""#include <cstdio>
#include <cstdlib>
#include <sched.h>
static int probe() {
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof(set), &set);
    std::fprintf(stderr, "cpus=%d\n", CPU_COUNT(&set));
    std::fflush(stderr);
    std::_Exit(1);
    return 0;
}
static int probed = probe();
int twice(int x) { return 2 * x; }
"""

# --- more ways to end as a broken environment does (tests/verifier/test_redteam_round11.py) ----
# the extension prints the sandbox's own words (`verifier.isolation.isolate` failing to drop root)
SANDBOX_CPP = r"""
#include <cstdio>
#include <cstdlib>
torch::Tensor relu_fwd(torch::Tensor x) {
    std::fputs("PermissionError: [sandbox] could not drop root to uid 1000123: [Errno 1] "
               "Operation not permitted\n", stderr);
    std::fflush(stderr);
    std::_Exit(1);
    return x;
}
"""
# the words of a worker that never started, as the harness's own result (the nonce found on the
# stack: redteam_cases.FRAME_NONCE; `P`: os, `S`: sys)
BROKEN_WORDS = ("worker exited with code 1: FileNotFoundError: [Errno 2] No such file or "
                "directory: '/tmp/venv/bin/python'")
FORGED_FAILURE = '''
def forge():
    data = {"nonce": nonce(), "stage": "correctness", "outcome": "runtime_error",
            "findings": [], "error": "BROKEN_WORDS"}
    fd = P.open("result.json", P.O_WRONLY | P.O_CREAT | P.O_TRUNC, 0o644)
    P.write(fd, S.modules["json"].dumps(data).encode())
    P.close(fd)
    P._exit(0)
'''.replace("BROKEN_WORDS", BROKEN_WORDS)
# static initializers that print the sandbox's own description of a child the host killed, or
# the parent's words of an import that took long, and exit: the load check's words are theirs
FORGED_DESCRIPTION = r'''#include <cstdio>
#include <cstdlib>
static int forged = (std::fputs("worker died with SIGKILL (killed (memory or CPU limit))\n",
                                stderr), std::fflush(stderr), std::_Exit(1), 0);
int twice(int x) { return 2 * x; }
'''
FORGED_SLOW = r'''#include <cstdio>
#include <cstdlib>
static int forged = (std::fputs("static initializers misbehave: its import took 14 s\n",
                                stderr), std::fflush(stderr), std::_Exit(1), 0);
int twice(int x) { return 2 * x; }
'''
