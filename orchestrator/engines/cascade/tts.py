"""Text-to-speech with eSpeak NG (formant synthesis), through ctypes.

eSpeak NG is process-global and not thread-safe: one set of voice and
parameters, one synthesis callback. So this module loads the library once
per process, guards every call with one lock, and runs every synthesis on
one dedicated worker thread (``espeak-tts``). Synthesis is fast (measured
~1000x real time on one core: a 3 s sentence in ~3 ms), so one thread
serves many concurrent sessions.

The library runs in ``AUDIO_OUTPUT_SYNCHRONOUS`` mode: ``espeak_Synth``
returns when the text is spoken, calling our callback with each block of
samples (about 60 ms at 22050 Hz, whatever buffer length is asked) as it
is produced. Returning 1 from the callback aborts the synthesis; that is
how cancellation works.
"""

from __future__ import annotations

import asyncio
import ctypes
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import espeakng_loader

# espeak_AUDIO_OUTPUT: synchronous retrieval, samples handed to the callback.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_BUFFER_MS = 20  # callback block size asked for; eSpeak NG rounds it up to ~60 ms
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE = 1  # espeakRATE, words per minute
_EE_OK = 0

DEFAULT_RATE_WPM = 175  # eSpeak's own default; speed=1.0 maps here
MIN_RATE_WPM = 80  # eSpeak NG's floor; slower speeds are clamped to it
MAX_RATE_WPM = 450  # eSpeak NG's ceiling; faster speeds are clamped to it
MAX_TEXT_CHARS = 4000  # one synthesis call; longer text raises ValueError (split it first)

# Public voice name -> eSpeak NG voice name (checked against the data shipped in
# espeakng-loader 0.2: the British "en" voice is not reachable as "en-gb").
_VOICES: dict[str, str] = {
    "en-us": "en-us",
    "en-us+f3": "en-us+f3",
    "en-us+m3": "en-us+m3",
    "en-gb": "en",
    "en-gb+f2": "en+f2",
    "en-gb-x-rp": "en-gb-x-rp",
    "en-gb-scotland": "en-gb-scotland",
    "en-us-nyc": "en-us-nyc",
}
DEFAULT_VOICE = "en-us"

_Callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class TtsError(Exception):
    pass


@dataclass
class _Job:
    on_chunk: Callable[[bytes], None]
    cancels: tuple[threading.Event, ...]  # any one set stops the synthesis
    cancelled: bool = False
    error: BaseException | None = None


class _Espeak:
    """The one process-wide eSpeak NG instance."""

    _instance: _Espeak | None = None
    _create_lock = threading.Lock()

    def __init__(self) -> None:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetSynthCallback.argtypes = [_Callback]
        lib.espeak_SetSynthCallback.restype = None
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetVoiceByName.restype = ctypes.c_int
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_SetParameter.restype = ctypes.c_int
        lib.espeak_Synth.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
        ]  # fmt: skip
        lib.espeak_Synth.restype = ctypes.c_int
        data = espeakng_loader.get_data_path().encode()
        rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, _BUFFER_MS, data, 0)
        if rate <= 0:
            raise TtsError(f"espeak_Initialize failed ({rate})")
        self.sample_rate: int = rate
        self._lib = lib
        self.lock = threading.Lock()
        self._job: _Job | None = None
        # Keep a reference: the C library holds only the raw function pointer.
        self._callback = _Callback(self._on_samples)
        lib.espeak_SetSynthCallback(self._callback)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="espeak-tts")

    @classmethod
    def get(cls) -> _Espeak:
        with cls._create_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def _on_samples(self, wav: ctypes._Pointer[ctypes.c_short], n: int, _events: int) -> int:
        job = self._job
        if job is None:
            return 1
        if any(flag.is_set() for flag in job.cancels):
            job.cancelled = True
            return 1  # abort the synthesis
        if wav and n > 0:
            try:
                job.on_chunk(ctypes.string_at(wav, n * 2))
            except BaseException as exc:  # never let an exception cross into C
                job.error = exc
                return 1
        return 0

    def synthesize(self, text: str, voice: str, rate_wpm: int, job: _Job) -> None:
        encoded = text.encode("utf-8")
        with self.lock:
            if self._lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
                raise TtsError(f"eSpeak NG has no voice {voice!r}")
            self._lib.espeak_SetParameter(_PARAM_RATE, rate_wpm, 0)
            self._job = job
            try:
                # size includes the NUL terminator, as the C API expects.
                err = self._lib.espeak_Synth(encoded, len(encoded) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
            finally:
                self._job = None
        if job.error is not None:
            raise job.error
        if err != _EE_OK and not job.cancelled:
            raise TtsError(f"espeak_Synth failed ({err})")


class EspeakSynthesizer:
    """Streams eSpeak NG speech (PCM16 mono at ``sample_rate``) sentence by sentence.

    All instances share the one process-wide library and worker thread.
    """

    def __init__(self) -> None:
        self._espeak: _Espeak | None = None

    def start(self) -> None:
        """Load and initialise the library (a few ms; idempotent)."""
        if self._espeak is None:
            self._espeak = _Espeak.get()

    @property
    def _lib(self) -> _Espeak:
        if self._espeak is None:
            self.start()
        assert self._espeak is not None
        return self._espeak

    @property
    def sample_rate(self) -> int:
        """Output rate reported by espeak_Initialize (22050 Hz with the shipped data)."""
        return self._lib.sample_rate

    @staticmethod
    def voices() -> tuple[str, ...]:
        return tuple(_VOICES)

    @staticmethod
    def rate_for(speed: float) -> int:
        """Words per minute for an OpenAI-style speed factor (1.0 = normal)."""
        wpm = round(DEFAULT_RATE_WPM * speed)
        return max(MIN_RATE_WPM, min(MAX_RATE_WPM, wpm))

    def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        on_chunk: Callable[[bytes], None],
        cancel: threading.Event | None = None,
    ) -> bool:
        """Speak ``text``, calling ``on_chunk(pcm16)`` for each block as it is made.

        Blocking; safe from any thread (one process-wide lock serialises
        eSpeak; ``stream`` runs it on the dedicated worker). Returns False
        when ``cancel`` was set and synthesis stopped early.
        """
        return self._run(text, voice, speed, on_chunk, () if cancel is None else (cancel,))

    def _run(
        self,
        text: str,
        voice: str | None,
        speed: float,
        on_chunk: Callable[[bytes], None],
        cancels: tuple[threading.Event, ...],
    ) -> bool:
        if len(text) > MAX_TEXT_CHARS:
            raise ValueError(f"text longer than {MAX_TEXT_CHARS} characters; split it")
        name = _VOICES.get(voice or DEFAULT_VOICE)
        if name is None:
            raise ValueError(f"unknown voice {voice!r}; choose one of {self.voices()}")
        job = _Job(on_chunk=on_chunk, cancels=cancels)
        if not text.strip():
            return True
        self._lib.synthesize(text, name, self.rate_for(speed), job)
        return not job.cancelled

    async def stream(
        self,
        text: str,
        voice: str | None = None,
        speed: float = 1.0,
        cancel: threading.Event | None = None,
    ) -> AsyncGenerator[bytes, None]:
        """Yield PCM16 blocks as the worker thread synthesises them.

        The worker stops at its next block when ``cancel`` is set (from any
        thread) or when the iteration is left early (break, cancellation, an
        exception); the caller's ``cancel`` itself is never set here. The
        queue is unbounded, but holds at most one sentence (``MAX_TEXT_CHARS``).
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        stop = threading.Event()
        cancels = (stop,) if cancel is None else (stop, cancel)

        def on_chunk(pcm: bytes) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, pcm)

        def work() -> None:
            try:
                self._run(text, voice, speed, on_chunk, cancels)
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        future = loop.run_in_executor(self._lib.executor, work)
        try:
            while True:
                chunk = await queue.get()
                if chunk is None:
                    break
                yield chunk
            await future  # re-raises a synthesis error
        finally:
            stop.set()
            if not future.done():
                # Don't leave an exception unretrieved when we abandon the job.
                future.add_done_callback(lambda f: f.cancelled() or f.exception())
