"""Speech-to-text with CMU pocketsphinx 5 (the en-us model shipped in its wheel).

Creating a ``Decoder`` loads the acoustic model, the language model and the
dictionary (~0.4 s; measured RSS: ~95 MB for the first, 15-40 MB for each
further one), so decoders are pooled and reused with
``start_utt``/``end_utt``. Measured on 16 kHz speech synthesised by eSpeak
NG, fed in 20 ms chunks with a partial hypothesis after each: 0.2-0.4 x
real time on one core.

Threading: every call on an ``Utterance`` blocks (run it on a worker
thread). Note that pocketsphinx's binding does *not* release the GIL while
decoding, so ``Utterance.feed`` slices its input into 20 ms blocks: other
threads (the event loop) get the GIL back between blocks, after at most a
few milliseconds, whatever the chunk size the caller passes.
"""

from __future__ import annotations

import threading
import time

from pocketsphinx import Decoder

SAMPLE_RATE = 16000  # the en-us model's rate; feed PCM16 mono at exactly this rate
DEFAULT_POOL_SIZE = 4
_SLICE_BYTES = SAMPLE_RATE * 2 * 20 // 1000  # 20 ms per process_raw call (GIL hold ~4 ms)


class RecognizerClosed(RuntimeError):
    pass


class PocketsphinxRecognizer:
    """A bounded pool of pocketsphinx decoders handing out ``Utterance``s.

    ``pool_size``: the most decoders (hence concurrent utterances) this
    recognizer keeps; each holds 15-40 MB. ``open`` creates decoders lazily up
    to that bound; when all are busy it waits for one to be returned (up to
    ``timeout``, then raises ``TimeoutError``). Thread-safe.
    """

    def __init__(self, pool_size: int = DEFAULT_POOL_SIZE) -> None:
        if pool_size < 1:
            raise ValueError("pool_size must be at least 1")
        self.pool_size = pool_size
        self._free: list[Decoder] = []
        self._created = 0
        self._cond = threading.Condition()
        self._closed = False
        self._cmn_prior = ""

    @staticmethod
    def _new_decoder() -> Decoder:
        # Default config = the bundled en-us acoustic model, LM and dictionary.
        # (Its feat.params fixes cmn; fed in pieces, the running mean is used.)
        return Decoder(loglevel="FATAL")

    def _build(self) -> Decoder:
        decoder = self._new_decoder()
        if not self._cmn_prior:
            self._cmn_prior = decoder.get_cmn(False)  # the model's cmninit, e.g. "40,3,-1"
        return decoder

    def _build_reserved(self) -> Decoder:
        """A new decoder for a slot already counted in ``_created``; the slot is
        given back (``_discard``) when building fails."""
        try:
            return self._build()
        except BaseException:
            self._discard()
            raise

    def warm(self, count: int = 1) -> None:
        """Create up to ``count`` idle decoders now, so the first requests don't pay for it."""
        for _ in range(count):
            with self._cond:
                if self._closed or self._created >= self.pool_size:
                    return
                self._created += 1
            self._release(self._build_reserved())

    @property
    def in_use(self) -> int:
        with self._cond:
            return self._created - len(self._free)

    def open(self, timeout: float | None = None) -> Utterance:
        """Take a decoder (creating one if the pool is not full) and start an utterance.

        Blocks while every decoder is busy; ``timeout`` seconds at most
        (None: no limit), then ``TimeoutError``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        decoder: Decoder | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise RecognizerClosed("recognizer is closed")
                if self._free:
                    decoder = self._free.pop()
                    break
                if self._created < self.pool_size:
                    self._created += 1  # reserve the slot; build outside the lock
                    break
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("no pocketsphinx decoder free")
                self._cond.wait(remaining)
        if decoder is None:
            decoder = self._build_reserved()
        try:
            # The running CMN mean carries over from the previous utterance,
            # which on a shared pool is someone else's voice and makes results
            # depend on history. Start every utterance from the model's prior.
            decoder.set_cmn(self._cmn_prior)
            decoder.start_utt()
        except BaseException:
            self._discard()
            raise
        return Utterance(self, decoder)

    def _release(self, decoder: Decoder) -> None:
        with self._cond:
            if self._closed:
                self._created -= 1  # dropped; the GC frees it
            else:
                self._free.append(decoder)
            self._cond.notify()

    def _discard(self) -> None:
        """Forget a decoder that failed; its slot can be rebuilt."""
        with self._cond:
            self._created -= 1
            self._cond.notify()

    def close(self) -> None:
        """Drop idle decoders; busy ones are dropped as they come back."""
        with self._cond:
            self._closed = True
            self._created -= len(self._free)
            self._free.clear()
            self._cond.notify_all()


class Utterance:
    """One utterance on a pooled decoder. Call ``finish`` or ``close`` exactly
    once to give the decoder back; both are idempotent. Calls are serialised
    by a lock, so ``close`` from another thread waits for a ``feed`` in
    progress (at most one 20 ms slice) rather than racing it.
    """

    def __init__(self, recognizer: PocketsphinxRecognizer, decoder: Decoder) -> None:
        self._recognizer = recognizer
        self._decoder: Decoder | None = decoder
        self._lock = threading.Lock()
        self._partial = ""
        self.samples = 0  # PCM16 samples fed so far

    @property
    def audio_seconds(self) -> float:
        return self.samples / SAMPLE_RATE

    @property
    def closed(self) -> bool:
        return self._decoder is None

    def feed(self, pcm16: bytes) -> str:
        """Decode PCM16 16 kHz audio; returns the partial hypothesis so far."""
        with self._lock:
            decoder = self._decoder
            if decoder is None:
                raise RuntimeError("utterance is finished")
            usable = len(pcm16) - len(pcm16) % 2
            for start in range(0, usable, _SLICE_BYTES):
                decoder.process_raw(pcm16[start : min(start + _SLICE_BYTES, usable)], False, False)
            self.samples += usable // 2
            hyp = decoder.hyp()
            self._partial = hyp.hypstr if hyp is not None else ""
            return self._partial

    def partial(self) -> str:
        return self._partial

    def finish(self) -> str:
        """End the utterance and return the final hypothesis; frees the decoder."""
        with self._lock:
            decoder = self._decoder
            if decoder is None:
                return self._partial
            self._decoder = None
            try:
                decoder.end_utt()
                hyp = decoder.hyp()
            except BaseException:
                self._recognizer._discard()
                raise
            self._partial = hyp.hypstr if hyp is not None else ""
            self._recognizer._release(decoder)
            return self._partial

    def close(self) -> None:
        """Abandon the utterance and give the decoder back (no final decode kept)."""
        with self._lock:
            decoder = self._decoder
            if decoder is None:
                return
            self._decoder = None
            try:
                decoder.end_utt()
            except Exception:  # a broken decoder is dropped, not pooled
                self._recognizer._discard()
                return
            self._recognizer._release(decoder)
