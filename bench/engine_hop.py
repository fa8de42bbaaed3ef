"""What the orchestrator costs per chunk in and out: a transcription stepped in place
(``engine.Transcriber``) against the same one iterated through ``transcribe``'s async
generators (a task step and three generator hops per chunk); and paced answers the
engine pushes (``engine.Responder``: the passthrough engine's one pacer steps them all)
against the same answers iterated through ``respond`` (a sleep, a task step and two
generator hops per chunk).

In one process, no sockets: an ``Orchestrator`` over the passthrough engine (unpaced)
runs ``--sessions`` transcriptions; each loop turn feeds one chunk to each (as 20 ms
of audio from that many sessions would), until ``--chunks`` chunks were answered.
The figure is CPU time (``time.process_time``) per chunk answered, the engine's own
work included; the two modes alternate trial by trial and the best trial of each is
quoted (the one least disturbed by the rest of the machine).

Answers: ``--answers`` paced responses side by side (20 ms chunks, a transcript word every
5, ``--answer-chunks`` chunks each, started together), until all are done; the figure is
CPU time per output delivered (deltas and the Finished).

    python bench/engine_hop.py            # ~25 s
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import uvloop

from orchestrator.engine import AudioChunk, ResponseRequest, TranscriptionRequest
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.orchestrator import Orchestrator

CHUNK = AudioChunk(b"\0" * 960)  # 20 ms of 24 kHz PCM16


class Count:
    """An ``on_output`` that counts the outputs."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, _: Any) -> None:
        self.n += 1


def refused(code: str, message: str) -> None:
    raise RuntimeError(f"{code}: {message}")


async def trial(*, stepped: bool, chunks: int, sessions: int) -> float:
    """CPU µs per chunk answered."""
    orch = Orchestrator(PassthroughEngine(paced=False))
    if not stepped:
        orch._transcriber = None  # as for an engine that offers no Transcriber
    answered = Count()

    handles = [
        orch.submit("transcription", TranscriptionRequest(f"r{i}"), on_output=answered, on_error=refused)
        for i in range(sessions)
    ]
    while len(orch._running) < sessions:  # noqa: ASYNC110  (every request admitted, waiting for input)
        await asyncio.sleep(0)
    rounds = chunks // sessions
    started = time.process_time()
    for _ in range(rounds):
        for handle in handles:
            handle.feed(CHUNK)
        await asyncio.sleep(0)  # one loop turn per round
    while answered.n < rounds * sessions:  # noqa: ASYNC110  (the last round delivered)
        await asyncio.sleep(0)
    spent = time.process_time() - started
    for handle in handles:
        handle.end()
    await asyncio.gather(*(h.task for h in handles))
    return spent / (rounds * sessions) * 1e6


async def answers_trial(*, pushed: bool, answers: int, chunks: int) -> float:
    """CPU µs per output delivered."""
    orch = Orchestrator(PassthroughEngine(audio_chunks=chunks, paced=True, words_every=5))
    if not pushed:
        orch._responder = None  # as for an engine that offers no Responder
    delivered = Count()

    started = time.process_time()
    handles = [
        orch.submit("response", ResponseRequest(f"r{i}", ()), on_output=delivered, on_error=refused)
        for i in range(answers)
    ]
    for handle in handles:
        handle.end()
    await asyncio.gather(*(h.task for h in handles))
    return (time.process_time() - started) / delivered.n * 1e6


def report(figures: dict[bool, list[float]], names: tuple[str, str], unit: str) -> None:
    for mode, name in zip((False, True), names, strict=True):
        runs = " ".join(f"{x:.2f}" for x in figures[mode])
        print(f"{name:24} {runs}  best {min(figures[mode]):.2f} µs per {unit}")
    print(f"{names[1].split()[0]} / {names[0].split()[0]}: {min(figures[True]) / min(figures[False]):.2f}")


async def main(args: argparse.Namespace) -> None:
    figures: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.trials):
        for stepped in (False, True):
            figures[stepped].append(await trial(stepped=stepped, chunks=args.chunks, sessions=args.sessions))
    report(figures, ("iterated (transcribe)", "stepped (transcriber)"), "chunk in")
    figures = {False: [], True: []}
    for _ in range(args.trials):
        for pushed in (False, True):
            figures[pushed].append(await answers_trial(pushed=pushed, answers=args.answers, chunks=args.answer_chunks))
    report(figures, ("iterated (respond)", "pushed (responder)"), "output")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="trials per mode (alternated)")
    parser.add_argument("--chunks", type=int, default=100_000, help="chunks answered per trial")
    parser.add_argument("--sessions", type=int, default=100, help="transcriptions fed side by side")
    parser.add_argument("--answers", type=int, default=200, help="paced answers side by side")
    parser.add_argument("--answer-chunks", type=int, default=100, help="20 ms chunks per answer (2 s)")
    uvloop.run(main(parser.parse_args()))
