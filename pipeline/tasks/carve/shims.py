"""torch-only stand-ins for well-known helpers of transformers, which a carved task may not import."""

from __future__ import annotations

# torch-only stand-ins for well-known helpers of transformers (which a task may not import).
SHIMS: dict[str, str] = {
    "ACT2FN": '''class _Activations(dict):
    """Activation name -> a fresh module (stand-in for transformers' ACT2FN)."""

    def __getitem__(self, key):
        # activations this stand-in does not know fall back to GELU (recorded in the task meta)
        return (super().__getitem__(key) if key in self else nn.GELU)()


ACT2FN = _Activations({
    "gelu": nn.GELU, "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_fast": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"), "gelu_python": nn.GELU,
    "quick_gelu": nn.GELU, "relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU, "swish": nn.SiLU,
    "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "mish": nn.Mish, "elu": nn.ELU, "selu": nn.SELU,
    "leaky_relu": nn.LeakyReLU, "linear": nn.Identity, "softplus": nn.Softplus,
    "hardswish": nn.Hardswish, "hardsigmoid": nn.Hardsigmoid, "prelu": nn.PReLU,
    "relu2": lambda: _ReLUSquared(), "gelu_accurate": lambda: nn.GELU(approximate="tanh"),
})


class _ReLUSquared(nn.Module):
    def forward(self, x):
        return torch.square(torch.relu(x))''',
    "ALL_ATTENTION_FUNCTIONS": '''class _AttentionFunctions(dict):
    """Always the eager implementation (stand-in for transformers' attention registry)."""

    def get_interface(self, name, default):
        return default


ALL_ATTENTION_FUNCTIONS = _AttentionFunctions()''',
    "ACT2CLS": '''ACT2CLS = {
    "gelu": nn.GELU, "relu": nn.ReLU, "relu6": nn.ReLU6, "silu": nn.SiLU, "swish": nn.SiLU,
    "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "mish": nn.Mish, "elu": nn.ELU, "selu": nn.SELU,
    "leaky_relu": nn.LeakyReLU, "linear": nn.Identity, "softplus": nn.Softplus,
}''',
    "is_torchdynamo_compiling": "def is_torchdynamo_compiling():\n    return False",
    "torch_compilable_check": '''def torch_compilable_check(cond, msg, error_type=ValueError):
    """Input validation of transformers; the task's inputs are fixed, so it checks nothing."""
    return None''',
    "get_activation": "def get_activation(name):\n    return ACT2FN[name]",
    "init": "from torch.nn import init",
    "maybe_autocast": ("def maybe_autocast(*args, **kwargs):\n"
                       "    return contextlib.nullcontext()  # tasks run in fp32, no autocast"),
    "Cache": "class Cache:\n    pass",
    "DynamicCache": "class DynamicCache(Cache):\n    pass",
    "EncoderDecoderCache": "class EncoderDecoderCache(Cache):\n    pass",
    "StaticCache": "class StaticCache(Cache):\n    pass",
    "logger": "logger = logging.getLogger(__name__)\nlogger.warning_once = logger.warning",
}
SHIM_NEEDS = {"ACT2FN": {"nn"}, "ACT2CLS": {"nn"}, "logger": {"logging"},
               "DynamicCache": {"Cache"}, "EncoderDecoderCache": {"Cache"},
               "StaticCache": {"Cache"}, "get_activation": {"ACT2FN"},
               "maybe_autocast": {"contextlib"}}  # torch is always imported
