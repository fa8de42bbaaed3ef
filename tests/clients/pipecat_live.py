"""pipecat's GPT-Live service (``OpenAILiveLLMService``) holds a spoken conversation with the
gateway's ``/v1/live/sessions`` (run on ``.venv-clients``'s python by
tests/clients/test_pipecat_live.py).

A pipeline as pipecat's Live examples build it (user context aggregator, the Live service,
assistant aggregator, with taps that record), with its defaults (client delegation with no
backend, no voice asked for), the microphone replaced by ``InputAudioRawFrame``s from
``--speech`` paced in real time. The session starts on the first context frame
(``LLMRunFrame``). Writes a JSON report to ``--out``: every error (ErrorFrames, pipecat's ERROR
log records, and its warnings about events it could not parse), what was transcribed,
what the model said and how much audio came back.

    python pipecat_live.py --url ws://127.0.0.1:PORT/v1/live/sessions --speech in.pcm --out report.json
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
    SpeechOutputAudioRawFrame,
    TranscriptionFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.live.llm import OpenAILiveLLMService
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
        elif isinstance(frame, SpeechOutputAudioRawFrame):
            r["audio_bytes"] += len(frame.audio)
        elif isinstance(frame, TTSTextFrame):
            r["said"] += frame.text
        elif isinstance(frame, TTSStoppedFrame):  # the model's turn ended
            r["answers"] += 1
            if r["transcripts"]:  # the answer to what we said
                self.done.set()
        await self.push_frame(frame, direction)


async def main(report: dict[str, Any], url: str, speech: bytes, timeout: float) -> None:
    done = asyncio.Event()
    llm = OpenAILiveLLMService(
        api_key="sk-test", base_url=url, settings=OpenAILiveLLMService.Settings(system_instruction="Answer briefly.")
    )
    context = LLMContext()
    pair = LLMContextAggregatorPair(context)
    # Taps on both sides of the service: transcripts and errors travel upstream, audio downstream.
    pipeline = Pipeline([Tap(report, done), pair.user(), Tap(report, done), llm, Tap(report, done), pair.assistant()])
    worker = PipelineWorker(
        pipeline, params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE), idle_timeout_secs=None
    )
    runner = WorkerRunner(handle_sigint=False)

    started = asyncio.Event()

    @llm.event_handler("on_session_started")
    async def on_started(_service: Any, session: Any) -> None:
        report["session_id"] = session.id
        started.set()

    async def talk() -> None:
        await worker.queue_frames([LLMRunFrame()])  # the session starts on the first context
        await started.wait()  # (it drops audio before the session has started)
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
            await worker.queue_frame(EndFrame())  # the service closes the session (session.close)

    talker = asyncio.create_task(talk())
    stopper = asyncio.create_task(stop())
    try:
        await asyncio.wait_for(runner.run(worker), timeout + 15)
    finally:
        talker.cancel()
        if stopper.done() and stopper.exception() is not None:
            report["errors"].append(f"timed out waiting for the answer: {report}")
        stopper.cancel()


def _warning(message: Any) -> None:
    text = str(message)
    if "unparseable" in text or "timed out waiting for session.closed" in text:
        report["log_errors"].append(text[:2000])


if __name__ == "__main__":
    report: dict[str, Any] = {
        "errors": [], "log_errors": [], "transcripts": [], "said": "", "audio_bytes": 0, "answers": 0, "session_id": "",
    }  # fmt: skip
    logger.add(lambda message: report["log_errors"].append(str(message)[:2000]), level="ERROR")  # pipecat: loguru
    logger.add(_warning, level="WARNING", filter=lambda record: record["level"].name == "WARNING")
    client_script.run(main, report)
