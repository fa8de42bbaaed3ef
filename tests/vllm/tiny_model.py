"""Writes a tiny random-weight Llama model that vLLM can load, at test time.

No weights can be downloaded here, so the model is made: a byte-level BPE
tokenizer trained with ``tokenizers`` on generated English-like text, saved as
a ``PreTrainedTokenizerFast`` with a small chat template (which renders tools
and tool calls), and a
``LlamaForCausalLM`` with random weights (seeded, so runs repeat). Its output is
random words: only whole-word tokens keep LM-head rows (and the model's
sampling defaults keep the top 20 tokens), and the rows of "." and of the
end-of-sequence token are scaled up so that sentences and answers end now and
then (most answers end within 20-150 tokens).

``write_tiny_idefics3`` writes a multimodal one the same way (Idefics3: images in).

Run as a script to write one: ``python tests/vllm/tiny_model.py DIR [--hidden 512 --layers 4]``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]
# Tools render as a system turn listing them (Hermes-style), an assistant's calls as
# <tool_call> JSON, a call's result as a "tool" turn: what tool-calling templates do.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\nYou may call these functions:\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}<tool_call>"
    '{"name": {{ c["function"]["name"] | tojson }}, "arguments": {{ c["function"]["arguments"] | tojson }}}'
    "</tool_call>{% endfor %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_WORDS = (
    "the a one every some this that my your our their cat dog bird fish horse child teacher doctor city river "
    "mountain house garden window street morning evening night day week year music story letter answer question "
    "voice sound picture light water fire stone tree flower road train ship plane book friend family people world "
    "runs walks sings speaks listens writes reads sees hears finds brings takes makes gives opens closes builds "
    "carries follows watches remembers learns knows thinks wants needs likes loves helps calls asks tells shows "
    "quickly slowly quietly loudly gently often never always sometimes today tomorrow here there again together "
    "red blue green small large old new happy tired bright dark warm cold early late near far strong soft clear "
    "in on at with from into over under after before near behind through across about"
).split()


def corpus(sentences: int = 3000, seed: int = 0) -> list[str]:
    """Generated English-like sentences (the tokenizer's training text)."""
    rng = random.Random(seed)
    out = []
    for _ in range(sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
        end = rng.choice([".", ".", ".", "?", "!"])
        sep = rng.choice([" ", ", "]) if len(words) > 6 else " "
        half = len(words) // 2
        text = " ".join(words[:half]) + sep + " ".join(words[half:])
        out.append(text[0].upper() + text[1:] + end)
    return out


def write_tokenizer(path: Path, vocab_size: int = 1000, extra_special: Sequence[str] = ()) -> int:
    """Trains and saves the tokenizer (with ``extra_special`` tokens added to
    ``SPECIAL``); returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*SPECIAL, *extra_special],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=[*SPECIAL[3:], *extra_special],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    fast.save_pretrained(str(path))
    return len(fast)


def shape_head(
    head: Any, ids: dict[str, int], hidden: int, period_boost: float, eos_boost: float, logit_scale: float
) -> None:
    """Only whole words (with their leading space), "." and the end of sequence
    keep LM-head rows; the others get zero logits, below the top_k best, so the
    output reads as (random) words."""
    import torch

    with torch.no_grad():
        keep = torch.zeros(head.shape[0], dtype=torch.bool)
        for token, i in ids.items():
            if token.startswith("\u0120") and token[1:] in _WORDS:  # \u0120: byte-level space
                keep[i] = True
        head.normal_(0.0, logit_scale / hidden**0.5)
        head[~keep] = 0.0
        head[ids["."]].normal_(0.0, period_boost * logit_scale / hidden**0.5)
        head[ids["</s>"]].normal_(0.0, eos_boost * logit_scale / hidden**0.5)


def write_tiny_llama(
    path: str | Path,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    intermediate: int | None = None,
    vocab_size: int = 1000,
    max_positions: int = 2048,
    period_boost: float = 4.0,
    eos_boost: float = 6.0,
    logit_scale: float = 1.5,
    top_k: int = 20,
    seed: int = 0,
) -> Path:
    """Writes tokenizer + random Llama weights (float32 safetensors) to ``path``.

    ``hidden / heads`` is the head size and must be at least 32 (vLLM's CPU
    attention). ``logit_scale``: the spread of the word logits (higher: more
    repetitive). ``top_k``: the sampling default in ``generation_config.json``.
    ``period_boost`` and ``eos_boost`` scale the LM-head rows of
    "." and of the end-of-sequence token relative to the words'.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if hidden // heads < 32:
        raise ValueError("head size (hidden / heads) must be at least 32")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path, vocab_size)
    ids = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate or hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=None,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    shape_head(model.lm_head.weight, ids, hidden, period_boost, eos_boost, logit_scale)
    # Sampling defaults vLLM applies from generation_config.json: only the top
    # words, so the zero-logit pieces are never sampled.
    model.generation_config.do_sample = True
    model.generation_config.top_k = top_k
    model.save_pretrained(str(path), safe_serialization=True)
    return path


# The image tokens Idefics3's processor looks up (vLLM expands each <image> in a prompt).
IDEFICS3_SPECIAL = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]


def write_tiny_idefics3(
    path: str | Path,
    *,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    image_size: int = 64,
    patch_size: int = 8,
    scale_factor: int = 2,
    seed: int = 0,
) -> Path:
    """Writes a random-weight Idefics3 (SmolVLM's architecture: a SigLIP-like
    vision tower, a pixel-shuffle connector and a Llama text model) to ``path``:
    the tokenizer above plus Idefics3's image tokens, its PIL image processor
    (no torchvision: vLLM's CPU install has none) without image splitting, and
    the text model's LM head shaped as the tiny Llama's. Each image becomes
    ``(image_size / patch_size)**2 / scale_factor**2`` ``<image>`` tokens (16 by
    default) whatever its size (resized to ``image_size`` on its longest edge).
    """
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        LlamaConfig,
        PreTrainedTokenizerFast,
    )
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig

    try:  # transformers 5: the PIL backend has a class of its own (the default one needs torchvision)
        from transformers.models.idefics3.image_processing_pil_idefics3 import (
            Idefics3ImageProcessorPil as ImageProcessor,
        )
    except ImportError:  # transformers 4: the one image processor is the PIL one
        from transformers import Idefics3ImageProcessor as ImageProcessor  # type: ignore[assignment]

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(path, extra_special=IDEFICS3_SPECIAL)
    ids = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
    text = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    # Head size 32 (hidden / heads), as vLLM's CPU attention needs.
    vision = Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch_size,
    )
    config = Idefics3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=ids["<image>"],
        scale_factor=scale_factor,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
    shape_head(model.lm_head.weight, ids, hidden, 4.0, 6.0, 1.5)
    model.generation_config.do_sample = True
    model.generation_config.top_k = 20
    model.save_pretrained(str(path), safe_serialization=True)
    images = ImageProcessor(
        do_image_splitting=False,
        size={"longest_edge": image_size},
        max_image_size={"longest_edge": image_size},
    )
    seq_len = (image_size // patch_size) ** 2 // scale_factor**2
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    Idefics3Processor(images, tokenizer, image_seq_len=seq_len, chat_template=CHAT_TEMPLATE).save_pretrained(str(path))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    print(write_tiny_llama(args.path, hidden=args.hidden, layers=args.layers, heads=args.heads))


if __name__ == "__main__":
    main()
