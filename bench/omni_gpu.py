"""The ``omni`` engine for real: vLLM-Omni's ``AsyncOmni`` on a GPU, through ``OmniEngine``.

Runs spoken answers end to end through the engine the gateway uses and prints,
over ``--runs`` answers:

- time to first audio: ``respond()`` called -> first ``AudioDelta`` (median, p90);
- time to first text delta;
- real-time factor: the answer's generation wall time / the audio's duration
  (below 1: faster than real time);
- the same with streaming input: the user's transcript arriving in three
  pieces 100 ms apart (vLLM's streaming input: the request starts on the first);
- with ``--asr``, a transcription of the first answer's audio.

The model, by default, is a tiny random-weight Qwen2.5-Omni written here
(thinker, talker and token2wav of the real architecture with small widths,
a byte-level BPE tokenizer trained here with Qwen's special tokens at their
ids, random speakers): nothing is downloaded, so the figures measure the
serving path, not a model's quality (its speech is noise). ``--model`` runs a
real checkpoint instead (e.g. a local copy of Qwen/Qwen2.5-Omni-3B).

    python bench/omni_gpu.py                         # tiny random-weight model
    python bench/omni_gpu.py --model /models/Qwen2.5-Omni-3B --runs 10 --asr

Needs a GPU machine with vllm-omni installed (it has no CPU platform). Where
``vllm_omni`` is not importable the script says so and exits with status 0
(``--require`` makes that status 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QWEN_SYSTEM = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)
QUESTION = "Tell me, in two sentences, why the sky is blue."
# Qwen2.5-Omni's special tokens and their ids (the config refers to these ids).
QWEN_SPECIAL = {
    151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151646: "<|AUDIO|>",
    151647: "<|audio_bos|>", 151648: "<|audio_eos|>", 151649: "<|box_end|>", 151650: "<|quad_start|>",
    151651: "<|quad_end|>", 151652: "<|vision_bos|>", 151653: "<|vision_eos|>", 151654: "<|vision_pad|>",
    151655: "<|IMAGE|>", 151656: "<|VIDEO|>",
}  # fmt: skip
TRAINED_VOCAB = 800  # BPE pieces trained here; ids up to Qwen's specials are padding
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_WORDS = (
    "the a sky sun light blue red air water sea cloud day night small large scatter short long wave color "
    "because when why how is are was were it they we you and or but so then of in on at to from with as"
).split()


# --- a tiny random-weight Qwen2.5-Omni ---------------------------------------------------


def write_tokenizer(path: Path) -> None:
    """A byte-level BPE trained here, padded with unreachable tokens so that
    Qwen's special tokens get the ids the model config names."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12))) + "." for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TRAINED_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    tok.train_from_iterator(corpus, trainer=trainer)
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    first_special = min(QWEN_SPECIAL)
    for i in range(len(vocab), first_special):
        vocab[f"<unused_{i}>"] = i  # never produced by the merges: only pads the ids
    spec["added_tokens"] = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, text in sorted(QWEN_SPECIAL.items())
    ]  # fmt: skip
    full = Tokenizer.from_str(json.dumps(spec))
    fast = PreTrainedTokenizerFast(tokenizer_object=full, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML, model_max_length=32768)  # fmt: skip
    fast.save_pretrained(str(path))


def write_tiny_qwen_omni(path: Path, seed: int = 0) -> Path:
    """Qwen2.5-Omni (thinker + talker + token2wav) with small widths and random weights."""
    import torch
    from transformers import (
        Qwen2_5OmniConfig,
        Qwen2_5OmniForConditionalGeneration,
        Qwen2VLImageProcessor,
        WhisperFeatureExtractor,
    )

    path.mkdir(parents=True, exist_ok=True)
    hidden, head = 128, 64
    # M-RoPE sections (temporal, height, width) must add up to head / 2.
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]}
    config = Qwen2_5OmniConfig(
        thinker_config={
            "vision_start_token_id": 151652, "vision_end_token_id": 151653, "vision_token_id": 151654,
            "pad_token_id": 151643,
            "audio_config": {"encoder_layers": 2, "encoder_attention_heads": 2, "encoder_ffn_dim": 256,
                             "d_model": 128, "output_dim": hidden},
            "vision_config": {"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2,
                              "out_hidden_size": hidden, "fullatt_block_indexes": [1]},
            "text_config": {"hidden_size": hidden, "intermediate_size": 512, "num_hidden_layers": 2,
                            "num_attention_heads": hidden // head, "num_key_value_heads": 2,
                            "max_position_embeddings": 4096, "max_window_layers": 2, "rope_parameters": rope},
        },
        talker_config={"hidden_size": hidden, "embedding_size": hidden, "intermediate_size": 512,
                       "num_hidden_layers": 2, "num_attention_heads": hidden // head, "num_key_value_heads": 2,
                       "head_dim": head, "max_position_embeddings": 4096, "max_window_layers": 2,
                       "rope_parameters": rope},
        token2wav_config={
            # num_embeds: every code the random talker may sample is a valid DiT embedding.
            "dit_config": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 64,
                           "look_ahead_layers": [1], "look_backward_layers": [0], "num_embeds": 8448},
            "bigvgan_config": {"upsample_initial_channel": 64},
        },
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    with torch.no_grad():
        # Text: only the trained BPE pieces keep LM-head rows (the id padding never
        # comes out), and the end of turn is made likelier so that answers end.
        head = model.thinker.lm_head.weight
        head[TRAINED_VOCAB : min(QWEN_SPECIAL)] = 0.0
        head[151645] *= 3.0  # <|im_end|>
        for code in (8292, 8294):  # the talker's codec end / pad: speech ends too
            model.talker.codec_head.weight[code] *= 6.0
    model.generation_config.eos_token_id = [151645, 151643]
    model.save_pretrained(str(path), safe_serialization=True)
    dit: Any = config.token2wav_config.dit_config  # type: ignore[union-attr]
    talker: Any = config.talker_config
    speakers = {
        name: {"cond": torch.randn(1, dit.enc_emb_dim), "ref_mel": torch.randn(1, 300, dit.mel_dim) * 0.1,
               "bos_token": talker.tts_codec_start_token_id}
        for name in ("Chelsie", "Ethan")
    }  # fmt: skip
    torch.save(speakers, path / "spk_dict.pt")
    write_tokenizer(path)
    # The processor's config (WhisperFeatureExtractor + Qwen2VLImageProcessor), written
    # directly: building the processor object needs torchvision for its video part.
    processor = {**WhisperFeatureExtractor(feature_size=128).to_dict(), **Qwen2VLImageProcessor().to_dict(),
                 "processor_class": "Qwen2_5OmniProcessor"}  # fmt: skip
    (path / "preprocessor_config.json").write_text(json.dumps(processor, indent=2, default=str))
    return path


# --- the measurements ---------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def pieces(texts: list[str], gap_s: float) -> AsyncIterator[Any]:
    from orchestrator.engine import TextChunk

    for text in texts:
        await asyncio.sleep(gap_s)
        yield TextChunk(text)


async def nothing() -> AsyncIterator[Any]:
    return
    yield


async def answer(engine: Any, request_id: str, streamed: bool) -> dict[str, float]:
    from orchestrator.engine import AudioDelta, Finished, Message, ResponseRequest, TextDelta

    if streamed:
        messages = (Message("user", ""),)  # the transcript is still coming: streaming input
        words = QUESTION.split()
        inputs = pieces([" ".join(words[:3]), " ".join(words[3:6]), " ".join(words[6:])], 0.1)
    else:
        messages = (Message("user", QUESTION),)
        inputs = nothing()
    request = ResponseRequest(request_id, messages, modalities=("audio",), max_output_tokens=128)
    start = time.perf_counter()
    first_audio = first_text = float("nan")
    samples = 0
    tokens = 0
    async for out in engine.respond(request, inputs):
        now = time.perf_counter() - start
        if isinstance(out, AudioDelta):
            if samples == 0:
                first_audio = now
            samples += len(out.pcm) // 2
        elif isinstance(out, TextDelta) and first_text != first_text:
            first_text = now
        elif isinstance(out, Finished):
            tokens = out.usage.output_text_tokens
    wall = time.perf_counter() - start
    audio_s = samples / engine.info.output_sample_rate
    return {"ttfa": first_audio, "ttft": first_text, "wall": wall, "audio_s": audio_s,
            "rtf": wall / audio_s if audio_s else float("nan"), "tokens": tokens}  # fmt: skip


def report(name: str, runs: list[dict[str, float]]) -> None:
    def col(key: str) -> list[float]:
        return [r[key] for r in runs if r[key] == r[key]]

    ttfa, ttft, rtf = col("ttfa"), col("ttft"), col("rtf")
    audio = sum(r["audio_s"] for r in runs)
    print(f"{name}: {len(runs)} answers, {audio:.1f} s of audio")
    if ttfa:
        median, p90 = statistics.median(ttfa) * 1000, pct(ttfa, 0.9) * 1000
        print(f"  time to first audio   median {median:7.1f} ms   p90 {p90:7.1f} ms")
    else:
        print("  time to first audio   no audio came back")
    if ttft:
        print(f"  time to first text    median {statistics.median(ttft) * 1000:7.1f} ms")
    if rtf:
        print(f"  real-time factor      median {statistics.median(rtf):7.3f}      (wall / audio; < 1 is faster)")


async def run(args: argparse.Namespace) -> int:
    from orchestrator.engine import AudioChunk, EngineError, TranscriptionRequest
    from orchestrator.engines.omni import OmniEngine

    model = args.model
    if model is None:
        tmp = tempfile.mkdtemp(prefix="tiny-qwen-omni-")
        print(f"writing a tiny random-weight Qwen2.5-Omni to {tmp} ...", flush=True)
        model = str(write_tiny_qwen_omni(Path(tmp)))
    kwargs: dict[str, Any] = {}
    if args.deploy_config:
        kwargs["deploy_config"] = args.deploy_config
    engine = OmniEngine(
        model,
        engine_kwargs=kwargs,
        voices=("Chelsie", "Ethan"),
        system_prompt=QWEN_SYSTEM,
        transcription_prompt="Transcribe the audio into text." if args.asr else None,
    )
    started = time.perf_counter()
    try:
        await engine.start()
    except EngineError as exc:
        print(f"omni_gpu: the engine did not start: {exc.code}: {exc.message}")
        return 1
    print(f"AsyncOmni started in {time.perf_counter() - started:.1f} s ({model})")
    try:
        await answer(engine, "warmup", streamed=False)
        plain = [await answer(engine, f"resp_{i}", streamed=False) for i in range(args.runs)]
        streamed = [await answer(engine, f"resp_s{i}", streamed=True) for i in range(args.runs)]
        report("one prompt", plain)
        report("streaming input (transcript in 3 pieces, 100 ms apart)", streamed)
        if args.asr:
            from orchestrator.engine import AudioDelta, Finished, Message, ResponseRequest

            pcm = b""
            request = ResponseRequest("resp_asr", (Message("user", QUESTION),), modalities=("audio",))
            async for out in engine.respond(request, nothing()):
                if isinstance(out, AudioDelta):
                    pcm += out.pcm
            import numpy as np
            import soxr

            audio16 = soxr.resample(np.frombuffer(pcm, "<i2"), engine.info.output_sample_rate, 16000)
            chunk = 16000 * 2 // 10

            async def audio_in() -> AsyncIterator[Any]:
                raw = audio16.astype("<i2").tobytes()
                for i in range(0, len(raw), chunk):
                    yield AudioChunk(raw[i : i + chunk])

            t = time.perf_counter()
            text = ""
            async for out in engine.transcribe(TranscriptionRequest("asr_0"), audio_in()):
                if isinstance(out, Finished):
                    text = out.text
            print(f"transcription of {len(pcm) / 2 / engine.info.output_sample_rate:.1f} s of audio in "
                  f"{(time.perf_counter() - t) * 1000:.0f} ms: {text[:80]!r}")  # fmt: skip
    finally:
        await engine.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a checkpoint (default: a tiny random-weight Qwen2.5-Omni written here)")
    parser.add_argument("--deploy-config", help="a vLLM-Omni deploy YAML (default: the model's pipeline)")
    parser.add_argument("--runs", type=int, default=5, help="answers measured per mode")
    parser.add_argument("--asr", action="store_true", help="also transcribe an answer (the model's speech-to-text)")
    parser.add_argument("--write-tiny", metavar="DIR", help="only write the tiny model to DIR, then exit")
    parser.add_argument("--require", action="store_true", help="exit 1 (not 0) when vllm_omni is missing")
    args = parser.parse_args()
    if args.write_tiny:
        print(write_tiny_qwen_omni(Path(args.write_tiny)))
        return 0
    try:
        import vllm_omni  # noqa: F401
    except Exception as exc:
        print(f"omni_gpu: vllm_omni is not importable ({type(exc).__name__}: {exc}); "
              "this benchmark needs a GPU machine with vllm-omni installed. Nothing measured.")  # fmt: skip
        return 1 if args.require else 0
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
