"""Writes the conformance corpus: candidates in the forms real models write, with expectations.

`python tests/verifier/conformance/make_corpus.py` regenerates cases/*.py and manifest.json.
Forms studied from KernelBench's prompts (the one-shot example: inline `cpp_sources`
declarations, `extra_cflags=[""]`, `extra_ldflags=[""]`, `verbose=True`) and public
KernelBench-style solutions; the candidates are written here. Each manifest row: file, task,
backend (cpu: C++ run in the default suite; cuda: compiled here, run by
benchmarks/conformance_gpu.py), expected status under `strict` and `partial` ("correct" means
correct_slow or correct_fast), and one line why.
"""

from __future__ import annotations

import json
from pathlib import Path

from cpu_sources import (  # sibling module: run as a script from this folder
    CPU_BIAS_RELU,
    CPU_LINEAR_DECL,
    CPU_LINEAR_DEF,
    CPU_RELU_ATEN,
    CPU_RELU_DECL,
    CPU_RELU_DEF,
    CPU_RELU_INPLACE,
    CPU_RELU_OMP,
    CPU_RELU_TEMPLATE,
    CPU_SCALE_DEF,
    CPU_SOFTMAX_DECL,
    CPU_SOFTMAX_DEF,
    TASKS,
)

HERE = Path(__file__).parent
HEAD = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"

ROWS: list[dict] = []


def q(src: str) -> str:
    return '"""' + src + '"""'


def add(name: str, task: str, backend: str, strict: str, partial: str, why: str,
        code: str) -> None:
    ROWS.append({"file": f"cases/{name}.py", "name": name, "task": task, "backend": backend,
                 "strict": strict, "partial": partial, "why": why, "code": code})


def cls(init: str, forward: str, sig: str = "") -> str:
    return (f"\n\nclass ModelNew(nn.Module):\n    def __init__(self{sig}):\n"
            f"        super().__init__()\n{init}\n    def forward(self, x):\n{forward}\n")


RELU_FWD = "        return ext.relu_forward(x)"


def cpu_relu(name: str, strict: str, partial: str, why: str, *, src: str = CPU_RELU_DEF,
             load: str | None = None, pre: str = "", init: str = "        pass",
             forward: str = RELU_FWD, task: str = "relu") -> None:
    load = load or ('ext = load_inline(name="relu_ext", cpp_sources=relu_src, '
                    'functions=["relu_forward"], extra_cflags=["-O3"], verbose=False)')
    add(name, task, "cpu", strict, partial, why,
        HEAD + pre + f"\nrelu_src = {q(src)}\n\n{load}" + cls(init, forward))


def cpu_cases() -> None:
    kb = ('ext = load_inline(\n    name="elementwise_relu",\n    cpp_sources=relu_cpp_source,\n'
          '    functions=["relu_forward"],\n    verbose=True,\n    extra_cflags=[""],\n'
          '    extra_ldflags=[""],\n)')
    add("cpu_kb_idiom", "relu", "cpu", "correct", "correct",
        "KernelBench one-shot idiom: empty flags, verbose, declaration + definition strings",
        HEAD + f"\nrelu_def = {q(CPU_RELU_DEF)}\nrelu_cpp_source = relu_def + "
        f'"{CPU_RELU_DECL}"\n\n{kb}' + cls("        self.op = ext", "        return "
                                            "self.op.relu_forward(x)"))
    flags = {
        "cpu_flags_blank": ('["", " "]', '[" "]', "correct", "blank flags vanish as in torch"),
        "cpu_flags_multi": ('["-O3 -funroll-loops", "-DNDEBUG"]', '[""]', "correct",
                            "several flags in one string are split like torch's shell"),
        "cpu_flags_fastmath_ok": ('["-O2 -ffast-math"]', '[]', "correct",
                                  "gcc fast-math spelled right builds"),
        "cpu_flags_nvcc_for_gcc": ('["-O3 --use_fast_math"]', '[""]', "compile_error",
                                   "nvcc flag given to g++ fails in torch too"),
        "cpu_flags_openmp": ('["-O3", "-fopenmp"]', '["-lgomp"]', "correct",
                             "OpenMP flags and linker flag"),
        "cpu_flags_std17": ('["-std=c++17"]', 'None', "correct", "a -std flag"),
    }
    for name, (cf, lf, status, why) in flags.items():
        src = CPU_RELU_OMP if "openmp" in name else CPU_RELU_DEF
        cpu_relu(name, status, status, why, src=src, load=(
            f'ext = load_inline("relu_ext", relu_src, functions=["relu_forward"], '
            f"extra_cflags={cf}, extra_ldflags={lf})"))
    cpu_relu("cpu_sources_list", "correct", "correct", "cpp_sources as a list (decl, def)",
             load='ext = load_inline("relu_ext", [relu_src, "' + CPU_RELU_DECL
                  + '"], functions=["relu_forward"])')
    cpu_relu("cpu_functions_str", "correct", "correct", "functions as one string",
             load='ext = load_inline("relu_ext", relu_src, functions="relu_forward")')
    cpu_relu("cpu_functions_dict", "correct", "correct", "functions as a dict of docstrings",
             load='ext = load_inline("relu_ext", relu_src, functions={"relu_forward": '
                  '"ReLU of a float tensor"})')
    cpu_relu("cpu_pybind_module", "correct", "correct",
             "functions=None: PYBIND11_MODULE written in the source",
             src=CPU_RELU_DEF + 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n'
                                '    m.def("relu_forward", &relu_forward, "relu");\n}\n',
             load='ext = load_inline(name="relu_mod", cpp_sources=relu_src, verbose=True)')
    cpu_relu("cpu_no_error_handling", "correct", "correct",
             "with_pytorch_error_handling=False",
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"], '
                  "with_pytorch_error_handling=False)")
    cpu_relu("cpu_keep_intermediates", "correct", "correct",
             "build arguments that do not change the module are accepted",
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"], '
                  "keep_intermediates=True, verbose=True, with_cuda=False, use_pch=False)")
    cpu_relu("cpu_in_function", "correct", "correct", "load_inline inside a helper function",
             load='def build():\n    return load_inline("relu_ext", relu_src, '
                  'functions=["relu_forward"])\n\n\next = build()')
    cpu_relu("cpu_in_try", "correct", "correct", "load_inline in a module-level try block",
             load='try:\n    ext = load_inline("relu_ext", relu_src, functions=['
                  '"relu_forward"])\nexcept RuntimeError as exc:\n    raise SystemExit('
                  'f"build failed: {exc}")')
    cpu_relu("cpu_in_init", "correct", "correct", "extension compiled inside __init__",
             load="", init='        self.ext = load_inline("relu_ext", relu_src, '
                           'functions=["relu_forward"])',
             forward="        return self.ext.relu_forward(x)")
    cpu_relu("cpu_in_init_local_src", "correct", "correct",
             "sources built as locals of __init__ (f-string free)", load="",
             init='        body = relu_src\n        self.ext = load_inline(name="relu_ext", '
                  'cpp_sources=[body], functions=["relu_forward"], extra_cflags=[""])',
             forward="        return self.ext.relu_forward(x)")
    cpu_relu("cpu_class_attr", "correct", "correct", "load_inline in a class body", load="",
             init="        pass", forward="        return ModelNew.ext.relu_forward(x)")
    ROWS[-1]["code"] = ROWS[-1]["code"].replace(
        "class ModelNew(nn.Module):\n", 'class ModelNew(nn.Module):\n    ext = load_inline('
        '"relu_ext", relu_src, functions=["relu_forward"])\n\n')
    cpu_relu("cpu_arch_env", "correct", "correct",
             "TORCH_CUDA_ARCH_LIST set by the candidate (a build setting, not an escape)",
             pre='import os\n\nos.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"\n')
    cpu_relu("cpu_two_extensions", "correct", "correct", "two load_inline calls, both used",
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"])\n'
                  f'scale_src = {q(CPU_SCALE_DEF)}\n'
                  'ext2 = load_inline("scale_ext", scale_src, functions=["scale_forward"])',
             forward="        return ext2.scale_forward(ext.relu_forward(x), 1.0)")
    cpu_relu("cpu_template_unroll", "correct", "correct",
             "templates, a helper struct and #pragma unroll", src=CPU_RELU_TEMPLATE)
    cpu_relu("cpu_openmp", "correct", "correct", "#pragma omp parallel for", src=CPU_RELU_OMP,
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"], '
                  'extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-lgomp"])')
    views = {
        "cpu_view_reshape": "        y = ext.relu_forward(x.view(-1))\n        return y.view(x.shape)",
        "cpu_flatten": "        y = ext.relu_forward(torch.flatten(x))\n        return y.reshape"
                       "(x.shape)",
        "cpu_cat_chunks": "        a, b = x.chunk(2, dim=0)\n        return torch.cat([ext.relu_"
                          "forward(a), ext.relu_forward(b)], dim=0)",
        "cpu_contiguous_t": "        y = ext.relu_forward(x.t().contiguous())\n        return y.t()",
        "cpu_unsqueeze_squeeze": "        return ext.relu_forward(x.unsqueeze(0)).squeeze(0)",
        "cpu_empty_and_copy": "        out = torch.empty_like(x)\n        out.copy_(ext.relu_"
                              "forward(x))\n        return out",
        "cpu_stack_unbind": "        rows = [ext.relu_forward(r) for r in x.unbind(0)]\n"
                            "        return torch.stack(rows, dim=0)",
        "cpu_clone_input": "        return ext.relu_forward(x.clone())",
    }
    for name, fwd in views.items():
        cpu_relu(name, "correct", "correct", "views/shape/copy ops around the own kernel are "
                 "never findings", forward=fwd)
    cpu_relu("cpu_dropout_eval", "correct", "correct", "nn.Dropout in eval is the identity",
             init="        self.drop = nn.Dropout(0.1)",
             forward="        return self.drop(ext.relu_forward(x))")
    cpu_relu("cpu_dropout_p0", "correct", "correct", "nn.Dropout(p=0.0)",
             init="        self.drop = nn.Dropout(p=0.0)",
             forward="        return self.drop(ext.relu_forward(x))")
    cpu_relu("cpu_identity", "correct", "correct", "nn.Identity",
             init="        self.id = nn.Identity()",
             forward="        return self.id(ext.relu_forward(x))")
    cpu_relu("cpu_flatten_layer", "correct", "correct", "nn.Flatten(0) then a view back",
             init="        self.flat = nn.Flatten(0)",
             forward="        return ext.relu_forward(self.flat(x)).view(x.shape)")
    cpu_relu("cpu_inplace_on_output", "correct", "correct", "in-place kernel on a fresh copy",
             src=CPU_RELU_INPLACE, load='ext = load_inline("relu_ip", relu_src, '
                                        'functions=["relu_inplace"])',
             forward="        out = x.clone()\n        ext.relu_inplace(out)\n        return out")
    cpu_relu("cpu_inplace_on_input", "incorrect", "incorrect",
             "in-place kernel on the input (the reference leaves it unchanged)",
             src=CPU_RELU_INPLACE, load='ext = load_inline("relu_ip", relu_src, '
                                        'functions=["relu_inplace"])',
             forward="        ext.relu_inplace(x)\n        return x")
    cpu_relu("cpu_partial_torch_after", "static_reject", "correct",
             "own kernel then torch.clamp_min: partial allows the library op",
             forward="        return torch.clamp_min(ext.relu_forward(x), 0.0)")
    cpu_relu("cpu_partial_method_after", "cheat", "correct",
             "own kernel then a chained tensor-method compute (.mul): the trace sees aten.mul",
             forward="        return ext.relu_forward(x).mul(1.0)")
    cpu_relu("cpu_full_fallback", "static_reject", "cheat",
             "extension built but forward is torch.relu only (no own kernel ran)",
             forward="        return torch.relu(x)")
    cpu_relu("cpu_hidden_fallback", "cheat", "cheat",
             "torch compute hidden behind getattr: the dispatcher trace sees aten.relu; no own "
             "kernel", forward='        f = getattr(x, "re" + "lu")\n        return f()')
    cpu_relu("cpu_hidden_partial", "cheat", "correct",
             "own kernel plus a hidden library op: strict catches it by the trace",
             forward='        y = ext.relu_forward(x)\n        return getattr(y, "ab" + "s")()')
    cpu_relu("cpu_try_fallback", "static_reject", "correct",
             "try own kernel, except -> torch: the own path runs",
             forward="        try:\n            return ext.relu_forward(x)\n        except "
                     "RuntimeError:\n            return torch.relu(x)")
    cpu_relu("cpu_aten_in_cpp", "static_reject", "correct",
             "at::relu from C++: strict rejects ATen compute; partial counts the call as own "
             "(CPU has no kernel profiler)", src=CPU_RELU_ATEN)
    cpu_relu("cpu_compile_error", "compile_error", "compile_error", "a C++ syntax error",
             src=CPU_RELU_DEF.replace("return out;", "return out"))
    cpu_relu("cpu_missing_definition", "compile_error", "compile_error",
             "declaration only: the import fails on an undefined symbol", src=CPU_RELU_DECL)
    cpu_relu("cpu_wrong_math", "incorrect", "incorrect", "leaky slope instead of relu",
             src=CPU_RELU_DEF.replace(": 0.f;", ": 0.1f * in[i];"))
    cpu_relu("cpu_no_load_inline_torch", "static_reject", "static_reject",
             "no extension at all", load="ext = None", forward="        return x.clamp(min=0)")
    ROWS[-1]["code"] = ROWS[-1]["code"].replace("from torch.utils.cpp_extension import "
                                                "load_inline\n", "")
    cpu_relu("cpu_same_name_a", "correct", "correct", "extension name shared with other "
             "candidates of the batch (sources differ)", src=CPU_RELU_TEMPLATE,
             load='ext = load_inline("shared_name", relu_src, functions=["relu_forward"])')
    cpu_relu("cpu_same_name_b", "correct", "correct", "the same name, other sources",
             src=CPU_RELU_OMP,
             load='ext = load_inline("shared_name", relu_src, functions=["relu_forward"])')
    cpu_relu("cpu_functions_tuple", "runtime_error", "runtime_error",
             "functions as a tuple: torch raises ValueError, so the module fails to load",
             load='ext = load_inline("relu_ext", relu_src, functions=("relu_forward",))')
    cpu_relu("cpu_positional_args", "correct", "correct",
             "every argument positional, in torch's order (cuda_sources None, flags lists)",
             load='ext = load_inline("relu_ext", relu_src, None, None, ["relu_forward"], [""], '
                  '[], [], [""])')
    cpu_relu("cpu_include_paths_empty", "correct", "correct",
             "extra_include_paths=[''] (the build folder in torch)",
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"], '
                  'extra_include_paths=[""])')
    cpu_relu("cpu_not_python_module", "compile_error", "compile_error",
             "is_python_module=False (TORCH_LIBRARY ops): not supported, said in the log",
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"], '
                  "is_python_module=False)")
    cpu_relu("cpu_pybind_args", "correct", "correct", "PYBIND11_MODULE with py::arg names",
             src=CPU_RELU_DEF + 'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n'
                                '    m.def("relu_forward", &relu_forward, "relu", '
                                'py::arg("x"));\n}\n',
             load='ext = load_inline(name="relu_mod", cpp_sources=[relu_src], functions=None)')
    cpu_relu("cpu_helper_class", "correct", "correct", "a Python helper class wraps the kernel",
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"])\n\n\n'
                  'class ReluOp:\n    def __call__(self, t):\n        return '
                  'ext.relu_forward(t.contiguous())',
             init="        self.op = ReluOp()", forward="        return self.op(x)")
    cpu_relu("cpu_module_wrapper_fn", "correct", "correct", "a module-level wrapper function",
             load='ext = load_inline("relu_ext", relu_src, functions=["relu_forward"])\n\n\n'
                  'def relu(t):\n    return ext.relu_forward(t)',
             forward="        return relu(x)")
    cpu_relu("cpu_kernel_table", "correct", "correct", "kernels kept in a dict",
             init='        self.kernels = {"relu": ext.relu_forward}',
             forward='        return self.kernels["relu"](x)')
    cpu_relu("cpu_functional_dropout_eval", "correct", "correct",
             "F.dropout(training=self.training) in eval",
             forward="        y = ext.relu_forward(x)\n        return torch.nn.functional."
                     "dropout(y, p=0.1, training=self.training)")
    cpu_relu("cpu_no_grad_block", "correct", "correct", "with torch.no_grad() in forward",
             forward="        with torch.no_grad():\n            return ext.relu_forward(x)")
    cpu_relu("cpu_zeros_then_inplace", "correct", "correct",
             "torch.zeros_like output then an in-place kernel writing max(x, 0)",
             src=CPU_RELU_INPLACE.replace("void relu_inplace(torch::Tensor x) {\n    float* p = "
                                          "x.data_ptr<float>();",
                                          "void relu_into(torch::Tensor x, torch::Tensor o) {\n"
                                          "    float* p = o.data_ptr<float>(); o.copy_(x);"),
             load='ext = load_inline("relu_into", relu_src, functions=["relu_into"])',
             forward="        out = torch.zeros_like(x)\n        ext.relu_into(x, out)\n"
                     "        return out")
    # linear task
    lin_init = "        self.fc = nn.Linear(in_features, out_features)"
    lin = [
        ("cpu_linear_own", "correct", "correct", "own fused linear+relu",
         "ext = load_inline('lin', [lin_src], functions=['linear_relu'], extra_cflags=[''])",
         "        return ext.linear_relu(x, self.fc.weight, self.fc.bias)"),
        ("cpu_linear_matmul_fallback", "static_reject", "correct",
         "torch.matmul for the GEMM, own bias+relu kernel (KernelBench partial)",
         "ext = load_inline('biasrelu', [bias_src], functions=['bias_relu'])",
         "        return ext.bias_relu(torch.matmul(x, self.fc.weight.t()), self.fc.bias)"),
        ("cpu_linear_at_operator", "static_reject", "correct",
         "the @ operator for the GEMM, own bias+relu",
         "ext = load_inline('biasrelu', [bias_src], functions=['bias_relu'])",
         "        return ext.bias_relu(x @ self.fc.weight.t(), self.fc.bias)"),
        ("cpu_linear_F_linear", "static_reject", "cheat",
         "F.linear + torch.relu only: nothing of its own ran",
         "ext = load_inline('biasrelu', [bias_src], functions=['bias_relu'])",
         "        return torch.relu(torch.nn.functional.linear(x, self.fc.weight, self.fc.bias))"),
        ("cpu_linear_two_kernels", "correct", "correct", "two own kernels: linear then relu",
         "ext = load_inline('lin2', [lin_src, bias_src], functions=['linear_relu', "
         "'bias_relu'])",
         "        y = ext.linear_relu(x, self.fc.weight, self.fc.bias)\n"
         "        return ext.bias_relu(y, torch.zeros_like(self.fc.bias))"),
        ("cpu_linear_decl_idiom", "correct", "correct", "KernelBench decl string, empty flags",
         "ext = load_inline(name='lin', cpp_sources=lin_src + lin_decl, functions=["
         "'linear_relu'], verbose=True, extra_cflags=[''], extra_ldflags=[''])",
         "        return ext.linear_relu(x, self.fc.weight, self.fc.bias)"),
    ]
    for name, strict, partial, why, load, fwd in lin:
        add(name, "linear", "cpu", strict, partial, why,
            HEAD + f"\nlin_src = {q(CPU_LINEAR_DEF)}\nlin_decl = \"{CPU_LINEAR_DECL}\"\n"
            f"bias_src = {q(CPU_BIAS_RELU)}\n\n{load}"
            + cls(lin_init, fwd, ", in_features, out_features"))
    sm = [
        ("cpu_softmax_own", "correct", "correct", "own row softmax (max-subtracted)",
         "        return ext.softmax_rows(x)"),
        ("cpu_softmax_library", "static_reject", "cheat", "torch.softmax only",
         "        return torch.softmax(x, dim=1)"),
        ("cpu_softmax_partial", "static_reject", "correct",
         "own softmax, then torch.log + torch.exp around it",
         "        return torch.exp(torch.log(ext.softmax_rows(x)))"),
        ("cpu_softmax_view", "correct", "correct", "view to 3-d and back",
         "        y = ext.softmax_rows(x.view(x.size(0), -1))\n        return y.view_as(x)"),
    ]
    extra_sm = [
        ("cpu_softmax_in_init", "correct", "correct", "softmax kernel built in __init__",
         "        return self.ext.softmax_rows(x)"),
        ("cpu_softmax_contiguous", "correct", "correct", "transpose twice and contiguous",
         "        return ext.softmax_rows(x.t().t().contiguous())"),
    ]
    sm = sm[:-1] + [sm[-1]] + extra_sm
    for name, strict, partial, why, fwd in sm:
        add(name, "softmax", "cpu", strict, partial, why,
            HEAD + f"\nsm_src = {q(CPU_SOFTMAX_DEF)}\n\n"
            "ext = load_inline(name='softmax_ext', cpp_sources=[sm_src, "
            f"'{CPU_SOFTMAX_DECL}'], functions=['softmax_rows'], extra_cflags=['-O2'])"
            + cls("        self.ext = load_inline('softmax_ext', [sm_src, "
                  f"'{CPU_SOFTMAX_DECL}'], functions=['softmax_rows'])" if "in_init" in name
                  else "        pass", fwd))


def main() -> None:
    from cuda_cases import cuda_cases  # noqa: PLC0415 - sibling module

    cpu_cases()
    cuda_cases(add, HEAD, cls, q)
    (HERE / "cases").mkdir(exist_ok=True)
    for old in (HERE / "cases").glob("*.py"):
        old.unlink()
    (HERE / "tasks").mkdir(exist_ok=True)
    for name, src in TASKS.items():
        (HERE / "tasks" / f"{name}.py").write_text(src)
    names = [r["name"] for r in ROWS]
    assert len(names) == len(set(names)), "duplicate case names"
    for r in ROWS:
        (HERE / r["file"]).write_text(r.pop("code"))
    (HERE / "manifest.json").write_text(json.dumps(ROWS, indent=1) + "\n")
    print(f"{len(ROWS)} cases: {sum(r['backend'] == 'cpu' for r in ROWS)} cpu, "
          f"{sum(r['backend'] == 'cuda' for r in ROWS)} cuda")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(HERE))
    main()
