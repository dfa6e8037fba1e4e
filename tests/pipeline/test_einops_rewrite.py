"""Differential tests: einops calls rewritten to torch give the outputs einops gives.

Each case is a module in the form research code writes it (vit-pytorch, x-transformers,
denoising-diffusion-pytorch); the original runs with einops, the rewrite without it, on random
inputs of several sizes (the axis lengths given as keywords stay fixed, the others vary).
"""

from __future__ import annotations

import ast
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tasks.normalize.einops_rewrite import rewrite_einops
from pipeline.tasks.normalize.errors import NormalizeError

einops = pytest.importorskip("einops")

HEADER = """\
import torch
from torch import nn
import einops
import einops as E
from einops import rearrange, reduce, repeat, pack, unpack, einsum, parse_shape
from einops import rearrange as rr
from einops.layers.torch import Rearrange, Reduce
import einops.layers.torch as EL

PATTERN = 'b n (h d) -> b h n d'
"""

# (init statements, forward expression of x and y, [(x shape, y shape or None), ...])
CASES = [
    # vit-pytorch
    ("", "rearrange(x, 'b n (h d) -> b h n d', h = 4)", [((2, 5, 32), None), ((1, 9, 8), None)]),
    ("", "rearrange(x, 'b h n d -> b n (h d)')", [((2, 4, 5, 8), None), ((1, 2, 3, 4), None)]),
    ("self.f = Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1 = 4, p2 = 4)", "self.f(x)",
     [((2, 3, 16, 16), None), ((1, 3, 8, 12), None)]),
    ("", "repeat(x, '1 1 d -> b 1 d', b = 3)", [((1, 1, 8), None), ((1, 1, 5), None)]),
    ("", "pack([y, x], 'b * d')", [((2, 5, 8), (2, 1, 8)), ((3, 2, 4), (3, 3, 4))]),
    ("", "unpack(pack([y, x], 'b * d')[0], [y.shape[1:-1], x.shape[1:-1]], 'b * d')",
     [((2, 5, 8), (2, 1, 8)), ((1, 4, 2, 3), (1, 2, 3))]),
    ("self.pool = Reduce('b n d -> b d', 'mean')", "self.pool(x)",
     [((2, 5, 8), None), ((3, 1, 4), None)]),
    ("", "rearrange(x, 'b ... d -> b (...) d')", [((2, 3, 4, 5), None), ((2, 6), None)]),
    ("self.f = Rearrange('b c (f pf) (h p1) (w p2) -> b (f h w) (p1 p2 pf c)', p1=2, p2=2, "
     "pf=2)", "self.f(x)", [((2, 3, 4, 4, 6), None), ((1, 1, 2, 2, 2), None)]),
    ("", "rearrange(x, 'b (h w) c -> b c h w', h = 4)", [((2, 16, 3), None), ((2, 8, 5), None)]),
    ("", "rearrange(x, 'b c h w -> b (h w) c')", [((2, 3, 4, 5), None), ((1, 2, 1, 3), None)]),
    ("self.f = Rearrange('b (h w) (p1 p2 c) -> b c (h p1) (w p2)', h=2, p1=2, p2=2)",
     "self.f(x)", [((2, 6, 12), None), ((1, 4, 4), None)]),
    ("", "repeat(x, 'n d -> b n d', b = 2)", [((5, 8), None), ((1, 3), None)]),
    ("", "einsum(x, y, 'b h i d, b h j d -> b h i j')",
     [((2, 3, 4, 5), (2, 3, 6, 5)), ((1, 1, 2, 3), (1, 1, 2, 3))]),
    ("", "einops.einsum(x, y, '... i dim, ... j dim -> ... i j')",
     [((2, 3, 4, 5), (2, 3, 6, 5)), ((4, 3), (2, 3))]),
    # x-transformers
    ("", "rearrange(x, '... (h d) -> ... h d', h = 2)", [((2, 3, 8), None), ((6,), None)]),
    ("", "repeat(x, 'b ... -> (b r) ...', r = 3)", [((2, 3, 4), None), ((2,), None)]),
    ("", "rearrange(x, 'b j -> b 1 1 j')", [((2, 5), None), ((1, 1), None)]),
    ("", "rearrange(x, 'b h n d -> b n h d')", [((2, 3, 4, 5), None)]),
    ("", "reduce(x, 'b n d -> b d', 'sum')", [((2, 3, 4), None), ((1, 7, 2), None)]),
    ("", "rearrange(x, 'n -> n 1')", [((5,), None), ((1,), None)]),
    ("", "rearrange(x, 'i j -> 1 1 i j')", [((3, 4), None)]),
    ("", "repeat(x, 'i j -> b h i j', b = 2, h = 3)", [((3, 4), None), ((1, 2), None)]),
    ("", "rearrange(x, 'b n d -> (b n) d')", [((2, 3, 4), None)]),
    ("", "rearrange(x, '(b n) d -> b n d', b = 2)", [((6, 4), None), ((2, 3), None)]),
    ("", "rearrange(x, 'b n (qkv h d) -> qkv b h n d', qkv = 3, h = 2)",
     [((2, 5, 24), None), ((1, 2, 6), None)]),
    ("", "rr(x, 'b n d -> b d n')", [((2, 3, 4), None)]),
    ("", "rearrange(x, PATTERN, h = 2)", [((2, 3, 8), None), ((1, 1, 2), None)]),
    # denoising-diffusion-pytorch
    ("self.f = Rearrange('b c (h p1) (w p2) -> b (c p1 p2) h w', p1 = 2, p2 = 2)", "self.f(x)",
     [((2, 3, 8, 8), None), ((1, 4, 2, 6), None)]),
    ("", "rearrange(x, 'b (h c) x y -> b h c (x y)', h = 2)",
     [((2, 8, 3, 5), None), ((1, 2, 1, 1), None)]),
    ("", "rearrange(x, 'b h (x y) d -> b (h d) x y', x = 4, y = 3)",
     [((2, 2, 12, 5), None), ((1, 1, 12, 1), None)]),
    ("", "reduce(x, 'b ... -> b', 'mean')", [((2, 3, 4), None), ((3, 2, 2, 2, 2), None)]),
    ("", "rearrange(x, 'b -> b 1 1 1')", [((4,), None)]),
    ("", "rearrange(x, 'b c -> b c 1 1')", [((2, 8), None)]),
    ("", "reduce(x, 'b c (h 2) (w 2) -> b c h w', 'mean')", [((2, 3, 8, 4), None)]),
    ("", "reduce(x, 'b c (h 2) (w 2) -> b c h w', 'max')", [((2, 3, 8, 4), None),
                                                             ((1, 1, 2, 6), None)]),
    ("", "reduce(x, 'b c h w -> b c', 'max')", [((2, 3, 4, 5), None)]),
    ("", "reduce(x, 'b c h w -> b c () ()', 'mean')", [((2, 3, 4, 5), None)]),
    ("", "reduce(x, 'b (n k) -> b n', 'prod', k = 2)", [((2, 6), None), ((3, 2), None)]),
    ("", "reduce(x, 'b n d -> b n', 'min')", [((2, 3, 4), None)]),
    ("", "repeat(x, 'h w -> h w 3')", [((4, 5), None), ((1, 1), None)]),
    ("", "repeat(x, 'h w -> (h 2) (w 2)')", [((4, 5), None)]),
    ("", "repeat(x, 'b c h w -> b c (h h2) (w w2)', h2 = 2, w2 = 2)", [((2, 3, 4, 5), None)]),
    ("", "rearrange(x, '... d -> ... 1 d')", [((2, 3, 4), None), ((5,), None)]),
    ("", "rearrange(x, '(b f) c h w -> b c f h w', f = 2)", [((4, 3, 2, 2), None)]),
    ("", "rearrange(x, 'b c f h w -> (b f) c h w')", [((2, 3, 4, 2, 2), None)]),
    # other forms: list input, keywords, module aliases, layers by attribute
    ("", "rearrange([x, x + 1], 'n b d -> b n d')", [((2, 3), None), ((4, 1), None)]),
    ("", "parse_shape(x, 'b _ h w')", [((2, 3, 4, 5), None)]),
    ("", "E.reduce(x, 'b n d -> b d', reduction='mean')", [((2, 3, 4), None)]),
    ("", "rearrange(tensor=x, pattern='b n d -> b d n')", [((2, 3, 4), None)]),
    ("self.f = einops.layers.torch.Rearrange('b n d -> b d n')", "self.f(x)",
     [((2, 3, 4), None)]),
    ("self.f = EL.Reduce('b (h h2) (w w2) c -> b h w c', 'max', h2=2, w2=2)", "self.f(x)",
     [((2, 4, 6, 3), None)]),
    ("", "repeat(x, 'd -> b n d', b = 2, n = 3)", [((4,), None)]),
    ("", "reduce(x > 0, 'b n d -> b d', 'any')", [((2, 3, 4), None)]),
    ("", "reduce(x > -1, 'b n d -> b', 'all')", [((2, 3, 4), None)]),
    ("", "einops.repeat(x, 'b n d -> b (n r) d', r = 2)", [((2, 3, 4), None)]),
    # more forms counted in x-transformers and denoising-diffusion-pytorch 2.x
    ("", "repeat(x.sum(), ' -> b', b = 3)", [((2, 3), None)]),
    ("", "rearrange(x, '... 1 -> ...')", [((2, 3, 1), None), ((1,), None)]),
    ("", "rearrange(x, '1 ... -> ...')", [((1, 3, 2), None)]),
    ("", "rearrange(x, '... d r -> ... (d r)')", [((2, 3, 4), None), ((3, 2), None)]),
    ("", "repeat(x, '... -> b ...', b = 2)", [((3, 4), None), ((5,), None)]),
    ("", "rearrange(x, 'b n h -> b h n 1')", [((2, 3, 4), None)]),
    ("", "rearrange(x, 'b (n m) d -> (b n) m d', m = 2)", [((2, 6, 3), None), ((1, 2, 1), None)]),
    ("", "reduce(x, 'b (h c) x y -> b h (x y) c', 'sum', h = 2)", [((2, 4, 3, 3), None)]),
    ("", "einsum(x, y, 'b h d n, b h e n -> b h d e')", [((2, 3, 4, 5), (2, 3, 6, 5))]),
    ("", "pack([x, y], '* n')", [((3, 4), (2, 5, 4))]),
    ("", "unpack(x, [[2], [-1]], 'b *')", [((3, 7), None)]),
]


def _module(init: str, expr: str) -> str:
    init = init or "pass"
    return HEADER + textwrap.dedent(f"""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            {init}

        def forward(self, x, y=None):
            return {expr}
    """)


def _run(source: str, x: torch.Tensor, y: torch.Tensor | None):
    scope: dict = {}
    exec(compile(source, "<task>", "exec"), scope)  # noqa: S102 - our own test modules
    return scope["Model"]()(x, y)


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(b, a)
    elif isinstance(a, dict):
        assert a == b
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _same(u, v)
    else:
        assert a == b


def _imports_einops(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.startswith("einops") for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("einops"):
            return True
    return False


def test_table_has_the_forms():
    assert len(CASES) >= 40


@pytest.mark.parametrize(("init", "expr", "shapes"), CASES, ids=[c[1][:60] for c in CASES])
def test_rewrite_matches_einops(init, expr, shapes):
    source = _module(init, expr)
    rewritten, done = rewrite_einops(source)
    assert done, "nothing was rewritten"
    assert not _imports_einops(rewritten)
    compile(rewritten, "<rewritten>", "exec")
    torch.manual_seed(0)
    for xs, ys in shapes:
        x = torch.randn(xs)
        y = torch.randn(ys) if ys else None
        _same(_run(source, x, y), _run(rewritten, x, y))


def test_rewritten_code_runs_without_einops(monkeypatch):
    source = _module("self.f = Rearrange('b c (h p) (w q) -> b (h w) (p q c)', p=2, q=2)",
                     "rearrange(self.f(x), 'b n (h d) -> b h n d', h=2)")
    rewritten, _ = rewrite_einops(source)
    monkeypatch.setitem(__import__("sys").modules, "einops", None)  # import einops now fails
    with pytest.raises(ImportError):
        _run(source, torch.randn(1, 1, 2, 2), None)
    assert _run(rewritten, torch.randn(2, 3, 4, 8), None).shape == (2, 2, 8, 6)


# random rearrange patterns: axes split into groups on both sides in any order
@st.composite
def _patterns(draw):
    n = draw(st.integers(1, 5))
    names = [f"a{i}" for i in range(n)]
    sizes = {a: draw(st.integers(1, 3)) for a in names}

    def grouping(order: list[str]) -> list[list[str]]:
        groups, i = [], 0
        while i < len(order):
            k = draw(st.integers(1, len(order) - i))
            groups.append(order[i:i + k])
            i += k
        return groups

    left = grouping(draw(st.permutations(names)))
    right = grouping(draw(st.permutations(names)))
    ell = draw(st.sampled_from([None, "first", "last"]))
    ell_shape = draw(st.lists(st.integers(1, 3), max_size=2)) if ell else []
    return names, sizes, left, right, ell, ell_shape


def _side(groups: list[list[str]], ell: str | None) -> str:
    parts = [g[0] if len(g) == 1 else f"({' '.join(g)})" for g in groups]
    if ell == "first":
        parts.insert(0, "...")
    elif ell == "last":
        parts.append("...")
    return " ".join(parts)


@settings(max_examples=60, deadline=None)
@given(_patterns())
def test_random_rearrange_patterns(case):
    names, sizes, left, right, ell, ell_shape = case
    pattern = f"{_side(left, ell)} -> {_side(right, ell)}"
    # the lengths of all but the first axis of each left group are given, as real calls do
    given_axes = {a: sizes[a] for g in left for a in g[1:]}
    kwargs = ", ".join(f"{a}={v}" for a, v in given_axes.items())
    expr = f"rearrange(x, {pattern!r}{', ' + kwargs if kwargs else ''})"
    source = _module("", expr)
    rewritten, _ = rewrite_einops(source)
    dims: list[int] = []
    for g in left:
        size = 1
        for a in g:
            size *= sizes[a]
        dims.append(size)
    shape = (ell_shape + dims) if ell == "first" else (dims + ell_shape)
    x = torch.randn(shape)
    _same(_run(source, x, None), _run(rewritten, x, None))


@pytest.mark.parametrize(("expr", "reason", "names"), [
    ("rearrange(x, self.pattern)", "einops_dynamic", "rearrange(x, self.pattern)"),
    ("rearrange(x, f'b n {self.k} -> b k n')", "einops_dynamic", "rearrange(x, f'b n"),
    ("reduce(x, 'b n d -> b d', self.op)", "einops_dynamic", "reduce(x, 'b n d -> b d'"),
    ("rearrange(x, 'b n d -> b d n', **self.axes)", "einops_dynamic", "**self.axes"),
    ("einops.asnumpy(x)", "unresolved_name", "einops.asnumpy"),
    ("list(map(rearrange, [x]))", "einops_unsupported", "rearrange"),
    ("rearrange(x, 'b (h d) -> b h d')", "einops_pattern", "rearrange(x, 'b (h d)"),
])
def test_what_cannot_be_rewritten_is_named(expr, reason, names):
    with pytest.raises(NormalizeError) as info:
        rewrite_einops(_module("self.pattern = 'b n -> n b'", expr))
    assert info.value.reason == reason
    assert names in info.value.detail


def test_einmix_import_is_named():
    source = "import torch\nfrom einops.layers.torch import EinMix\n\nm = EinMix('b d -> b e')\n"
    with pytest.raises(NormalizeError) as info:
        rewrite_einops(source)
    assert (info.value.reason, info.value.detail) == ("unresolved_name", "einops.EinMix")


def test_source_without_einops_is_unchanged():
    source = "import torch\nfrom functools import reduce\n\nx = reduce(max, [1, 2])\n"
    assert rewrite_einops(source) == (source, [])


VIT_FILE = '''\
import torch
from torch import nn

from einops import rearrange, repeat
from einops.layers.torch import Rearrange


def pair(t):
    return t if isinstance(t, tuple) else (t, t)


class Attention(nn.Module):
    def __init__(self, dim, heads = 4, dim_head = 16):
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias = False)
        self.to_out = nn.Linear(inner_dim, dim)

    def forward(self, x):
        qkv = self.to_qkv(x).chunk(3, dim = -1)
        q, k, v = map(lambda t: rearrange(t, 'b n (h d) -> b h n d', h = self.heads), qkv)
        attn = (torch.matmul(q, k.transpose(-1, -2)) * self.scale).softmax(dim = -1)
        out = torch.matmul(attn, v)
        return self.to_out(rearrange(out, 'b h n d -> b n (h d)'))


class PatchViT(nn.Module):
    def __init__(self, dim = 32, patch_size = 4, channels = 3):
        super().__init__()
        ph, pw = pair(patch_size)
        self.to_patch = nn.Sequential(
            Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)', p1 = ph, p2 = pw),
            nn.Linear(channels * ph * pw, dim),
        )
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.attn = Attention(dim)

    def forward(self, img):
        x = self.to_patch(img)
        cls = repeat(self.cls_token, '1 1 d -> b 1 d', b = x.shape[0])
        return self.attn(torch.cat((cls, x), dim = 1))
'''


def test_carved_class_is_torch_only_and_computes_the_same():
    from pipeline.tasks.carve.carve import extract_class

    ext = extract_class(VIT_FILE, "PatchViT", "vit/vit.py")
    assert not _imports_einops(ext.source)
    assert any(n.startswith("rearrange:b c (h p1)") for n in ext.normalized)
    original: dict = {}
    exec(compile(VIT_FILE, "vit.py", "exec"), original)  # noqa: S102
    carved: dict = {}
    exec(compile(ext.source, "task.py", "exec"), carved)  # noqa: S102
    for shape in ((2, 3, 8, 8), (1, 3, 12, 16)):
        torch.manual_seed(1)
        ref = original["PatchViT"]()
        torch.manual_seed(1)
        new = carved["Model"]()
        img = torch.randn(shape)
        torch.testing.assert_close(new(img), ref(img))


def test_extract_tasks_gives_an_einops_free_task(tmp_path):
    from pipeline.config import TasksConfig
    from pipeline.tasks.extract import extract_tasks
    from schemas import RawModule

    def raw(name: str) -> RawModule:
        return RawModule(RawModule.make_id("git", "", "", "vit.py", name, VIT_FILE), "git", "",
                         "", "vit.py", "MIT", name, VIT_FILE)

    bad = VIT_FILE.replace("'b h n d -> b n (h d)'", "self.out_pattern")
    dynamic = RawModule(RawModule.make_id("git", "", "", "bad.py", "Attention", bad), "git",
                        "", "", "bad.py", "MIT", "Attention", bad)
    tasks, rejections = extract_tasks([raw("Attention"), dynamic], TasksConfig(workers=1))
    assert [t.original_name for t in tasks] == ["Attention"]
    assert not _imports_einops(tasks[0].source) and not _imports_einops(tasks[0].cpu_source)
    assert [r.reason for r in rejections] == ["einops_dynamic"]
    assert "rearrange(out, self.out_pattern)" in rejections[0].detail


@st.composite
def _reductions(draw):
    n = draw(st.integers(2, 5))
    names = [f"a{i}" for i in range(n)]
    sizes = {a: draw(st.integers(1, 3)) for a in names}
    kept = [a for a in names if draw(st.booleans())]
    out = draw(st.permutations(kept))
    op = draw(st.sampled_from(["sum", "mean", "max", "min", "prod"]))
    return names, sizes, list(out), op


@settings(max_examples=40, deadline=None)
@given(_reductions())
def test_random_reduce_patterns(case):
    names, sizes, out, op = case
    # the first two input axes arrive merged, as `(h w)` does in real code
    left = f"({names[0]} {names[1]}) " + " ".join(names[2:])
    pattern = f"{left} -> {' '.join(out)}"
    expr = f"reduce(x, {pattern!r}, {op!r}, {names[1]}={sizes[names[1]]})"
    source = _module("", expr)
    rewritten, _ = rewrite_einops(source)
    x = torch.randn([sizes[names[0]] * sizes[names[1]], *(sizes[a] for a in names[2:])])
    _same(_run(source, x, None), _run(rewritten, x, None))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.booleans())
def test_random_repeat_patterns(n, r, c, merge):
    right = "(b r) n c" if merge else "b n r c"
    expr = f"repeat(x, 'b n -> {right}', r={r}, c={c})"
    source = _module("", expr)
    rewritten, _ = rewrite_einops(source)
    x = torch.randn(2, n)
    _same(_run(source, x, None), _run(rewritten, x, None))


PACK_ONE = HEADER + '''

def pack_one(t, pattern):
    return pack([t], pattern)


def unpack_one(t, ps, pattern):
    return unpack(t, ps, pattern)[0]


class Model(nn.Module):
    def forward(self, x, y=None):
        packed, ps = pack_one(x, 'b * d')
        return unpack_one(packed.cumsum(dim=1), ps, 'b * d')
'''


def test_pack_one_helpers_parse_the_pattern_at_run_time():
    rewritten, done = rewrite_einops(PACK_ONE)
    assert "pack:pattern at run time" in done and not _imports_einops(rewritten)
    for shape in ((2, 3, 4, 5), (1, 7, 2), (3, 1)):
        x = torch.randn(shape)
        _same(_run(PACK_ONE, x, None), _run(rewritten, x, None))
