"""Local transformers generation with a tiny random Llama and a tokenizer built offline."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from pipeline.candidates.llm import LLMError, make_backend
from pipeline.candidates.llm.hf_local import HFChatBackend
from pipeline.config import GenerateConfig
from schemas import Message

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} <end> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
WORDS = ("write a cuda kernel for relu softmax matmul the input is x y of shape float "
         "system user assistant end you are an expert fix bug please < > ` ( ) . , :").split()


def _tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(["<pad>", "<unk>", "<bos>", "<eos>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<eos>", bos_token="<bos>",
                                   chat_template=chat_template)


@pytest.fixture(scope="module")
def tiny() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tokenizer = _tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id)
    model = LlamaForCausalLM(config).eval()
    return model, tokenizer


SHORT = [Message("user", "write a relu kernel")]
LONG = [Message("system", "you are an expert"),
        Message("user", "write a cuda kernel for softmax the input is x of shape float")]


def test_render_uses_chat_template(tiny) -> None:
    model, tok = tiny
    backend = HFChatBackend(model, tok, name="tiny")
    assert backend.render(SHORT) == "<user> write a relu kernel <end> <assistant> "
    assert backend.generator_name == "hf:tiny"


def test_batched_sampling_shapes_and_usage(tiny) -> None:
    model, tok = tiny
    backend = HFChatBackend(model, tok, name="tiny", temperature=1.0, top_p=0.9,
                            max_new_tokens=6, batch_size=2, seed=3)
    prompts = [SHORT, LONG, SHORT]
    out = backend.chat(prompts, n=2)
    assert len(out) == 3 and all(len(s) == 2 for s in out)
    lens = [len(tok(backend.render(p), add_special_tokens=False)["input_ids"]) for p in prompts]
    for samples, n_prompt in zip(out, lens, strict=True):
        for c in samples:
            assert c.prompt_tokens == n_prompt  # padding is not counted as prompt
            assert 0 < c.completion_tokens <= 6
            assert c.finish_reason in ("stop", "length")
            assert "<pad>" not in c.text
    again = backend.chat(prompts, n=2)  # seeded: the same samples again
    assert [[c.text for c in s] for s in again] == [[c.text for c in s] for s in out]


def test_left_padding_does_not_change_greedy_output(tiny) -> None:
    model, tok = tiny
    greedy = HFChatBackend(model, tok, temperature=0.0, max_new_tokens=8, batch_size=2)
    alone = greedy.chat([SHORT], n=1)[0][0].text
    batched = greedy.chat([LONG, SHORT], n=1)[1][0].text  # SHORT is left-padded here
    assert batched == alone


def test_from_pretrained_loads_a_local_checkpoint(tiny, tmp_path: Path) -> None:
    model, tok = tiny
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    cfg = GenerateConfig(hf_model=str(tmp_path / "ckpt"), hf_device="cpu", hf_dtype="float32",
                         max_tokens=4, temperature=0.0, hf_batch_size=3)
    backend = make_backend("hf", cfg)
    assert isinstance(backend, HFChatBackend) and backend.batch_size == 3
    expected = HFChatBackend(model, tok, temperature=0.0, max_new_tokens=4).chat([SHORT])
    assert backend.chat([SHORT])[0][0].text == expected[0][0].text


def test_missing_model_or_template_is_named(tmp_path: Path) -> None:
    with pytest.raises(LLMError, match="hf_model is empty"):
        make_backend("hf", GenerateConfig())
    with pytest.raises(LLMError, match="cannot load local model"):
        make_backend("hf", GenerateConfig(hf_model=str(tmp_path / "nowhere"), hf_device="cpu"))
    with pytest.raises(LLMError, match="no chat_template"):
        HFChatBackend(object(), _tokenizer(chat_template=None), name="x")
