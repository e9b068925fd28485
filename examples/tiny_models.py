"""Tiny Hugging Face models with random weights that vLLM (CPU) loads from a folder: no hub.

Sizes are the smallest vLLM's CPU attention accepts (head size >= 32), in float32 (bf16 in
vLLM's default multi-process mode can crash in the AMX attention kernel). The tokenizer is a
word-level one trained here on generated text: prompts are words ``w0`` ... ``w399``, one token
each, so a prompt of N words is exactly N tokens.
"""

from __future__ import annotations

from pathlib import Path

VOCAB = 512
WORDS = 400
COMMON = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=2, torch_dtype="float32")


def prompt(first: int, count: int) -> str:
    """A prompt of ``count`` tokens."""
    return " ".join(f"w{(first + i) % WORDS}" for i in range(count))


def _tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = [prompt(i * 7, 12) for i in range(WORDS)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(text, trainers.WordLevelTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(folder)


def build_llama(folder: Path) -> Path:
    """A dense 2-layer Llama."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**COMMON)).save_pretrained(folder)
    _tokenizer(folder)
    return folder


def build_mixtral(folder: Path, num_experts: int = 4, top_k: int = 2) -> Path:
    """A 2-layer Mixtral (MoE: ``num_experts`` experts, ``top_k`` per token)."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(num_local_experts=num_experts, num_experts_per_tok=top_k, **COMMON)
    MixtralForCausalLM(config).save_pretrained(folder)
    _tokenizer(folder)
    return folder
