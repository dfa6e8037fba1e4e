"""Torch definitions of common dependencies that a task may not import: timm's building blocks,
and stand-ins for helpers that do not change the computation (tqdm, packaging.version).

`timm.layers` (and the older `timm.models.layers`) blocks are plain torch underneath; a carved
task gets their definitions, written after timm 1.0 (same parameters in the same order, same
computation), instead of the import. Each definition is self-contained (it uses `torch` and
function-local imports only), so it cannot clash with names the task itself imports.
"""

from __future__ import annotations

TIMM_MODULES = ("timm.layers", "timm.models.layers")

# name -> (source, names of other definitions it needs, in order)
TIMM: dict[str, tuple[str, tuple[str, ...]]] = {
    "_ntuple": ('''def _ntuple(n):
    def parse(x):
        from collections.abc import Iterable
        if isinstance(x, Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(x for _ in range(n))
    return parse''', ()),
    "to_1tuple": ("to_1tuple = _ntuple(1)", ("_ntuple",)),
    "to_2tuple": ("to_2tuple = _ntuple(2)", ("_ntuple",)),
    "to_3tuple": ("to_3tuple = _ntuple(3)", ("_ntuple",)),
    "to_4tuple": ("to_4tuple = _ntuple(4)", ("_ntuple",)),
    "to_ntuple": ("to_ntuple = _ntuple", ("_ntuple",)),
    "make_divisible": ('''def make_divisible(v, divisor=8, min_value=None, round_limit=0.9):
    min_value = min_value or divisor
    new_v = max(min_value, int(v + divisor / 2) // divisor * divisor)
    if new_v < round_limit * v:
        new_v += divisor
    return new_v''', ()),
    "drop_path": ('''def drop_path(x, drop_prob: float = 0.0, training: bool = False,
              scale_by_keep: bool = True):
    """Stochastic depth per sample (timm.layers.drop_path)."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor''', ()),
    "DropPath": ('''class DropPath(torch.nn.Module):
    """Stochastic depth per sample (timm.layers.DropPath)."""

    def __init__(self, drop_prob: float = 0.0, scale_by_keep: bool = True):
        super().__init__()
        self.drop_prob = drop_prob
        self.scale_by_keep = scale_by_keep

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training, self.scale_by_keep)''',
                 ("drop_path",)),
    "Mlp": ('''class Mlp(torch.nn.Module):
    """Linear, activation, dropout, norm, linear, dropout (timm.layers.Mlp)."""

    def __init__(self, in_features, hidden_features=None, out_features=None,
                 act_layer=torch.nn.GELU, norm_layer=None, bias=True, drop=0.0,
                 use_conv=False, device=None, dtype=None):
        import functools
        dd = {"device": device, "dtype": dtype}
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        bias = to_2tuple(bias)
        drop_probs = to_2tuple(drop)
        linear_layer = (functools.partial(torch.nn.Conv2d, kernel_size=1) if use_conv
                        else torch.nn.Linear)
        self.fc1 = linear_layer(in_features, hidden_features, bias=bias[0], **dd)
        self.act = act_layer()
        self.drop1 = torch.nn.Dropout(drop_probs[0])
        self.norm = (norm_layer(hidden_features, **dd) if norm_layer is not None
                     else torch.nn.Identity())
        self.fc2 = linear_layer(hidden_features, out_features, bias=bias[1], **dd)
        self.drop2 = torch.nn.Dropout(drop_probs[1])

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        return self.drop2(x)''', ("to_2tuple",)),
    "LayerNorm": ('''class LayerNorm(torch.nn.LayerNorm):
    """LayerNorm over the last dim with timm's eps default (timm.layers.LayerNorm)."""

    def __init__(self, num_channels, eps=1e-6, affine=True, device=None, dtype=None):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine, device=device,
                         dtype=dtype)''', ()),
    "LayerNorm2d": ('''class LayerNorm2d(torch.nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (timm.layers.LayerNorm2d)."""

    def __init__(self, num_channels, eps=1e-6, affine=True, device=None, dtype=None):
        super().__init__(num_channels, eps=eps, elementwise_affine=affine, device=device,
                         dtype=dtype)

    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = torch.nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias,
                                           self.eps)
        return x.permute(0, 3, 1, 2)''', ()),
    "_assert": ('''def _assert(condition: bool, message: str):
    assert condition, message''', ()),
    "use_fused_attn": ('''def use_fused_attn(experimental: bool = False) -> bool:
    """timm's switch to F.scaled_dot_product_attention; a task keeps the explicit math."""
    return False''', ()),
    "trunc_normal_": ('''def trunc_normal_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    """Truncated normal init in place (timm.layers.trunc_normal_)."""
    return torch.nn.init.trunc_normal_(tensor, mean, std, a, b)''', ()),
    "trunc_normal_tf_": ('''def trunc_normal_tf_(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0):
    """Truncated normal with bounds on the unscaled normal (timm.layers.trunc_normal_tf_)."""
    with torch.no_grad():
        torch.nn.init.trunc_normal_(tensor, 0.0, 1.0, a, b)
        tensor.mul_(std).add_(mean)
    return tensor''', ()),
    "lecun_normal_": ('''def lecun_normal_(tensor):
    """LeCun normal init, truncated (timm.layers.lecun_normal_)."""
    import math
    fan_in, _ = torch.nn.init._calculate_fan_in_and_fan_out(tensor)
    return trunc_normal_tf_(tensor, std=math.sqrt(1.0 / fan_in) / 0.87962566103423978)''',
                      ("trunc_normal_tf_",)),
}


# helpers of other libraries that do not change what a module computes: (module, name) -> source
OTHER: dict[tuple[str, str], str] = {
    **{(m, "tqdm"): '''def tqdm(iterable=None, *args, **kwargs):
    """Progress bars are not part of a task: the iterable itself (stand-in for tqdm)."""
    return iterable''' for m in ("tqdm", "tqdm.auto", "tqdm.notebook", "tqdm.rich")},
    ("packaging", "version"): '''class version:
    """packaging.version stand-in: compares the numeric release part of a version."""

    @staticmethod
    def parse(text):
        import re
        return tuple(int(p) for p in re.findall(r"\\d+", str(text).split("+")[0])[:3])''',
}


def _is_timm_layers(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in TIMM_MODULES)


def dependency_definitions(module: str, name: str) -> list[tuple[str, str]] | None:
    """[(defined name, source), ...] in dependency order for `from module import name`, or None
    when the name is not a known torch building block of that module."""
    if (module, name) in OTHER:
        return [(name, OTHER[(module, name)])]
    if not _is_timm_layers(module) or name not in TIMM:
        return None
    out: list[tuple[str, str]] = []

    def add(n: str) -> None:
        source, needs = TIMM[n]
        for dep in needs:
            add(dep)
        if all(n != have for have, _ in out):
            out.append((n, source))

    add(name)
    return out


def absolute_module(importer: str, module: str, level: int) -> str:
    """The dotted module a (possibly relative) import in file `importer` names."""
    if not level:
        return module
    parts = importer.replace("\\", "/").split("/")[:-1]
    if level - 1 > len(parts):
        return module
    base = parts[:len(parts) - (level - 1)]
    return ".".join([*base, *([module] if module else [])])
