"""pipecat's ``OpenAIRealtimeLLMService`` holds a voice conversation with the
gateway (run on ``.venv-clients``'s python by tests/clients/test_pipecat_client.py).

A pipeline as pipecat's realtime examples build it (user context aggregator,
the realtime service, assistant aggregator, with taps that record), with its
defaults (server VAD) and input transcription by its own
``InputAudioTranscription()`` (model ``gpt-realtime-whisper``), the microphone replaced by
``InputAudioRawFrame``s from ``--speech`` paced in real time. Writes a JSON
report to ``--out``: the frames seen, every error (ErrorFrames and pipecat's
ERROR log records), what was transcribed and how much audio came back.

    python pipecat_voice.py --url ws://127.0.0.1:PORT/v1/realtime --speech in.pcm --out report.json
"""

from __future__ import annotations

import asyncio
from typing import Any

import client_script  # this directory's shared command line (tests/clients/client_script.py)
from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    InputAudioRawFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

RATE = 24000
CHUNK = RATE * 2 * 20 // 1000  # 20 ms of PCM16


class Tap(FrameProcessor):
    """Records the frames that pass, both ways, into the report."""

    def __init__(self, report: dict[str, Any], done: asyncio.Event) -> None:
        super().__init__()
        self.report = report
        self.done = done

    async def process_frame(self, frame: Any, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        r = self.report
        if isinstance(frame, ErrorFrame):
            r["errors"].append(str(frame.error)[:2000])
        elif isinstance(frame, TranscriptionFrame):
            r["transcripts"].append(frame.text)
        elif isinstance(frame, TTSAudioRawFrame):
            r["audio_bytes"] += len(frame.audio)
        elif isinstance(frame, TTSStoppedFrame):
            r["answers"] += 1
            if r["transcripts"]:  # the answer to what we said
                self.done.set()
        await self.push_frame(frame, direction)


async def main(report: dict[str, Any], url: str, speech: bytes, timeout: float) -> None:
    done = asyncio.Event()
    # Input transcription as pipecat's own InputAudioTranscription() names it (gpt-realtime-whisper).
    audio = events.AudioConfiguration(input=events.AudioInput(transcription=events.InputAudioTranscription()))
    settings = OpenAIRealtimeLLMService.Settings(session_properties=events.SessionProperties(audio=audio))
    llm = OpenAIRealtimeLLMService(api_key="sk-test", base_url=url, settings=settings)
    context = LLMContext()
    pair = LLMContextAggregatorPair(context)
    # Taps on both sides of the service: transcripts and errors travel upstream, audio downstream.
    pipeline = Pipeline([Tap(report, done), pair.user(), Tap(report, done), llm, Tap(report, done), pair.assistant()])
    worker = PipelineWorker(
        pipeline, params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE), idle_timeout_secs=None
    )
    runner = WorkerRunner(handle_sigint=False)

    async def talk() -> None:
        await worker.queue_frames([LLMRunFrame()])
        await asyncio.sleep(1.0)
        for i in range(0, len(speech), CHUNK):
            await worker.queue_frame(InputAudioRawFrame(audio=speech[i : i + CHUNK], sample_rate=RATE, num_channels=1))
            await asyncio.sleep(0.02)  # a microphone: real time
        while not done.is_set():  # and it keeps streaming silence
            await worker.queue_frame(InputAudioRawFrame(audio=bytes(CHUNK), sample_rate=RATE, num_channels=1))
            await asyncio.sleep(0.02)

    async def stop() -> None:
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            await worker.queue_frame(EndFrame())

    talker = asyncio.create_task(talk())
    stopper = asyncio.create_task(stop())
    try:
        await asyncio.wait_for(runner.run(worker), timeout + 15)
    finally:
        talker.cancel()
        if stopper.done() and stopper.exception() is not None:
            report["errors"].append(f"timed out waiting for the answer: {report}")
        stopper.cancel()


if __name__ == "__main__":
    report: dict[str, Any] = {"errors": [], "log_errors": [], "transcripts": [], "audio_bytes": 0, "answers": 0}
    logger.add(lambda message: report["log_errors"].append(str(message)[:2000]), level="ERROR")  # pipecat: loguru
    client_script.run(main, report)
