"""Offline stand-ins for the pretrained checkpoints KernelBench level 4 loads.

A level-4 file builds `AutoModelForCausalLM.from_pretrained(name)` with
`AutoConfig.from_pretrained`, which would download weights. The fingerprint needs only the
forward's op sequence, which depends on the architecture, not the weights: each checkpoint is
replaced by its transformers config class with the checkpoint's published hyperparameters (its
`config.json` on the Hub), and the model is built with `from_config` on whatever device is
current (meta while tracing). Runs in the sandboxed tracer (`pipeline.tasks.curate.benchmark_trace`);
imports transformers only when a file does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# checkpoint -> (config class, architecture hyperparameters of its config.json)
CHECKPOINTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("GPT2Config", dict(
        vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12,
        activation_function="gelu_new", bos_token_id=50256, eos_token_id=50256)),
    "facebook/opt-1.3b": ("OPTConfig", dict(
        vocab_size=50272, hidden_size=2048, num_hidden_layers=24, ffn_dim=8192,
        num_attention_heads=32, max_position_embeddings=2048, word_embed_proj_dim=2048,
        do_layer_norm_before=True, activation_function="relu", enable_bias=True,
        pad_token_id=1, bos_token_id=2, eos_token_id=2)),
    "EleutherAI/gpt-neo-2.7B": ("GPTNeoConfig", dict(
        vocab_size=50257, hidden_size=2560, num_layers=32, num_heads=20,
        attention_types=[[["global", "local"], 16]], window_size=256,
        max_position_embeddings=2048, activation_function="gelu_new",
        bos_token_id=50256, eos_token_id=50256)),
    "facebook/bart-large": ("BartConfig", dict(
        vocab_size=50265, d_model=1024, encoder_layers=12, decoder_layers=12,
        encoder_attention_heads=16, decoder_attention_heads=16, encoder_ffn_dim=4096,
        decoder_ffn_dim=4096, max_position_embeddings=1024, activation_function="gelu",
        scale_embedding=False, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, forced_bos_token_id=0)),
    "google/bigbird-roberta-base": ("BigBirdConfig", dict(
        vocab_size=50358, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        intermediate_size=3072, hidden_act="gelu_new", max_position_embeddings=4096,
        type_vocab_size=2, attention_type="block_sparse", block_size=64,
        num_random_blocks=3, use_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        sep_token_id=66)),
    "google/electra-small-discriminator": ("ElectraConfig", dict(
        vocab_size=30522, embedding_size=128, hidden_size=256, num_hidden_layers=12,
        num_attention_heads=4, intermediate_size=1024, hidden_act="gelu",
        max_position_embeddings=512, type_vocab_size=2, pad_token_id=0)),
    # d_model 1024, d_ff 4096, 8 heads and 64K positions as the Reformer paper states for enwik8;
    # chunk lengths, buckets and axial shapes as its config.json (they do not change which ops
    # run, so the first-use op sequence holds even if one were off)
    "google/reformer-enwik8": ("ReformerConfig", dict(
        vocab_size=258, hidden_size=1024, num_attention_heads=8, attention_head_size=128,
        attn_layers=["local", "lsh"] * 6, feed_forward_size=4096, hidden_act="relu",
        axial_pos_embds=True, axial_pos_shape=[128, 512], axial_pos_embds_dim=[256, 768],
        local_attn_chunk_length=128, lsh_attn_chunk_length=256, num_buckets=512,
        num_hashes=4, max_position_embeddings=65536, is_decoder=True, pad_token_id=0,
        local_num_chunks_before=1, local_num_chunks_after=0, lsh_num_chunks_before=1,
        lsh_num_chunks_after=0, chunk_size_lm_head=0)),
}


class UnknownCheckpoint(LookupError):
    """A file loads a checkpoint with no stand-in here; the message names it."""


def standin_config(name: str) -> Any:
    """The transformers config of checkpoint `name`, built offline."""
    import transformers

    if name not in CHECKPOINTS:
        raise UnknownCheckpoint(f"no offline stand-in for checkpoint {name!r}")
    cls, params = CHECKPOINTS[name]
    return getattr(transformers, cls)(**params)


def _config_of(name: Any, kwargs: dict[str, Any]) -> Any:
    cfg = kwargs.get("config")
    return cfg if cfg is not None and not isinstance(cfg, str) else standin_config(str(name))


@contextmanager
def offline_pretrained() -> Iterator[list[str]]:
    """While active, `Auto*.from_pretrained` builds the stand-in (random weights, current
    device) instead of downloading; yields the checkpoints it stood in for."""
    import transformers

    used: list[str] = []
    saved: list[tuple[type, Any]] = []

    def config_from_pretrained(cls: type, name: Any, *args: Any, **kwargs: Any) -> Any:
        used.append(str(name))
        return standin_config(str(name))

    def model_from_pretrained(cls: type, name: Any, *args: Any, **kwargs: Any) -> Any:
        used.append(str(name))
        return cls.from_config(_config_of(name, kwargs))

    autos = [getattr(transformers, n) for n in dir(transformers)
             if n.startswith("AutoModel") and hasattr(getattr(transformers, n), "from_config")]
    for cls, fn in [(transformers.AutoConfig, config_from_pretrained),
                    *[(c, model_from_pretrained) for c in autos]]:
        saved.append((cls, cls.__dict__.get("from_pretrained")))
        cls.from_pretrained = classmethod(fn)
    try:
        yield used
    finally:
        for cls, orig in saved:  # an inherited method is restored by removing the override
            if orig is None:
                del cls.from_pretrained
            else:
                cls.from_pretrained = orig
