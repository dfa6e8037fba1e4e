"""The stand-in for a transformers-style `config` argument: the config class's defaults, shrunk to
task size, rendered as a small concrete `ModelConfig`.
"""

from __future__ import annotations

import ast
import re

from pipeline.tasks.carve.closure import (
    FileInfo,
    Resolver,
    parse_file,
    root_name,
)
from verifier import pyast

# Fallback values for config fields a class reads when the config class cannot be parsed.
GENERIC_CONFIG: dict[str, object] = {
    "hidden_size": 256, "intermediate_size": 1024, "num_attention_heads": 8,
    "num_key_value_heads": 8, "num_hidden_layers": 2, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "layer_norm_eps": 1e-5,
    "rms_norm_eps": 1e-6, "vocab_size": 1024, "max_position_embeddings": 2048,
    "attention_dropout": 0.0, "attention_bias": False, "mlp_bias": False, "d_model": 256,
    "initializer_range": 0.02, "dropout": 0.0, "activation_function": "gelu",
    "_attn_implementation": "eager", "pad_token_id": 0, "type_vocab_size": 2,
    "num_labels": 2, "num_channels": 3, "patch_size": 4, "image_size": 32,
    "layer_norm_epsilon": 1e-5,
    "hidden_dropout": 0.0, "attention_dropout_prob": 0.0, "activation_dropout": 0.0,
    "rope_theta": 10000.0, "num_experts": 4, "num_experts_per_tok": 2, "num_local_experts": 4,
    "moe_intermediate_size": 256, "head_dim": 32, "classifier_dropout": 0.0, "use_bias": True,
    "bias": True, "qkv_bias": True, "norm_eps": 1e-5, "eps": 1e-5,
    "embed_dim": 256, "projection_dim": 256, "d_ff": 1024, "d_kv": 32, "num_heads": 8,
    "partial_rotary_factor": 1.0, "sliding_window": None, "output_attentions": False,
    "use_cache": False, "is_decoder": False, "chunk_size_feed_forward": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
_DIM_FIELD = re.compile(r"(^|_)(hidden_size|intermediate_size|d_model|d_ff|ffn_dim|embed_dim|"
                        r"hidden_dim|d_kv|head_dim|dim|n_embd|n_inner|kv_channels|"
                        r"projection_dim|mlp_dim|ffn_hidden_size|moe_intermediate_size|"
                        r"d_inner|embedding_size|hidden_sizes|num_channels_hidden)$")
MAX_HIDDEN = 512
MAX_VOCAB = 8192
MAX_LAYERS = 2

# --- config stand-in --------------------------------------------------------------------------


def config_defaults(info: FileInfo, class_name: str, resolver: Resolver | None,
                    depth: int = 0) -> dict[str, object]:
    """Literal defaults of a config class: annotated class fields and `__init__` keywords."""
    b = info.bindings.get(class_name)
    if b is None or depth > 3:
        return {}
    if b.kind != "def":
        if resolver is None:
            return {}
        found = resolver(info.path, b.module, b.level)
        return config_defaults(parse_file(*found), b.orig, resolver, depth + 1) if found else {}
    node = info.tree.body[b.index]
    if not isinstance(node, ast.ClassDef):
        return {}
    values: dict[str, object] = {}
    for base in node.bases:  # inherited defaults first, own ones override
        base_name = root_name(base)
        if base_name.endswith("Config") and base_name not in ("PretrainedConfig",
                                                              "PreTrainedConfig"):
            values.update(config_defaults(info, base_name, resolver, depth + 1))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            _put_literal(values, stmt.target.id, stmt.value)
        elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
              and isinstance(stmt.targets[0], ast.Name)):
            _put_literal(values, stmt.targets[0].id, stmt.value)
        elif isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            args = stmt.args
            pos = args.args[len(args.args) - len(args.defaults):]
            for a, d in zip(pos, args.defaults, strict=True):
                _put_literal(values, a.arg, d)
            for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
                if d is not None:
                    _put_literal(values, a.arg, d)
    return values


def _put_literal(values: dict, name: str, node: ast.expr) -> None:
    if isinstance(node, ast.Call) and node.args == [] and any(
            k.arg == "default" for k in node.keywords):  # interval(...)(default=0.02)
        node = next(k.value for k in node.keywords if k.arg == "default")
    try:
        value = pyast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return
    if isinstance(value, int | float | str | bool | list | tuple | type(None)):
        values[name] = value


def small_config(defaults: dict[str, object], fields: list[str]) -> dict[str, object]:
    """The fields a class reads, with dims shrunk so the task runs on CPU and GPU sizes vary."""
    cfg = {k: v for k, v in defaults.items() if k in fields or k in ("hidden_size",
                                                                       "num_attention_heads")}
    for k in fields:
        if cfg.get(k) is None:
            cfg[k] = GENERIC_CONFIG.get(k, _guess_field(k))
    hidden = cfg.get("hidden_size") or cfg.get("d_model") or cfg.get("n_embd")
    factor = 1
    if isinstance(hidden, int) and hidden > MAX_HIDDEN:
        while hidden // factor > MAX_HIDDEN:
            factor *= 2
    for k, v in list(cfg.items()):
        if factor > 1 and isinstance(v, int) and not isinstance(v, bool) and _DIM_FIELD.search(k):
            cfg[k] = max(8, v // factor)
        elif factor > 1 and isinstance(v, list) and _DIM_FIELD.search(k) and all(
                isinstance(x, int) for x in v):
            cfg[k] = [max(8, x // factor) for x in v]
    for k, v in list(cfg.items()):
        if isinstance(v, int) and not isinstance(v, bool):
            if "vocab" in k and v > MAX_VOCAB:
                cfg[k] = MAX_VOCAB
            elif re.search(r"num_(hidden_)?layers|n_layers?$|num_blocks|depth$", k) and v > 2:
                cfg[k] = MAX_LAYERS
            elif re.search(r"dropout|drop_prob|_prob$", k):
                cfg[k] = 0
        elif isinstance(v, float) and re.search(r"dropout|drop_prob|_prob$|drop_path", k):
            cfg[k] = 0.0
    heads = cfg.get("num_attention_heads")
    if "head_dim" in cfg and cfg["head_dim"] is None and isinstance(hidden, int) and heads:
        cfg["head_dim"] = (hidden // factor) // int(heads)
    if "num_key_value_heads" in cfg and cfg["num_key_value_heads"] is None:
        cfg["num_key_value_heads"] = heads
    if "layer_types" in cfg and not isinstance(cfg["layer_types"], list):
        cfg["layer_types"] = ["full_attention"] * 4
    if "rope_parameters" in cfg and not isinstance(cfg["rope_parameters"], dict):
        # both access styles: rope_parameters["rope_theta"] and rope_parameters[layer_type]
        default = dict(GENERIC_CONFIG["rope_parameters"])  # type: ignore[arg-type]
        cfg["rope_parameters"] = {**default, "full_attention": dict(default),
                                  "sliding_attention": dict(default)}
    vocab = cfg.get("vocab_size")
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(vocab, int) and isinstance(cfg.get(k), int) and cfg[k] >= vocab:
            cfg[k] = 0
    cfg["_attn_implementation"] = "eager"
    return dict(sorted(cfg.items()))


def _guess_field(name: str) -> object:
    """A value for a config field that has no literal default (None means unknown)."""
    if re.search(r"(_size|_dim|_dims|^dim|_channels|_features|_width)$", name) and \
            "window" not in name and "max" not in name:
        return 256
    if re.search(r"^(num|n)_", name):
        return 4
    if re.search(r"eps|epsilon", name):
        return 1e-5
    if re.search(r"dropout|drop_prob|_prob$", name):
        return 0.0
    if "vocab" in name:
        return 1024
    return None


def config_source(name: str, values: dict[str, object], subs: dict[str, list[str]]) -> str:
    lines = [f"    {k} = {v!r}" for k, v in values.items() if k.isidentifier() and k not in subs]
    for sub, fields in sorted(subs.items()):
        inner = small_config({}, fields)
        lines.append(f"\n    class {sub}:\n" + "\n".join(
            f"        {k} = {v!r}" for k, v in inner.items() if k.isidentifier()) + "\n")
    body = "\n".join(lines)
    return (f'class ModelConfig:\n    """Small concrete stand-in for {name} '
            f'(the fields the model reads)."""\n\n{body}\n\n'
            "    def get(self, key, default=None):\n        return getattr(self, key, default)\n")
