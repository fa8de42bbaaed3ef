"""Test support: the gateway as a user runs it (a command in a subprocess), and the
turns a user's client takes, written with raw ``websockets`` (no SDK of ours)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import websockets
from support.speech import chunks, silence, speak


class ServeError(AssertionError):
    pass


class Served:
    """A shell command running a gateway (its own process group), and its log."""

    def __init__(self, command: str, *, port: int, cwd: Path, log_path: Path, env: Mapping[str, str]) -> None:
        self.command = command
        self.port = port
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def log(self, chars: int = 4000) -> str:
        return self.log_path.read_bytes()[-chars:].decode(errors="replace")

    def wait_ready(self, timeout_s: float, path: str = "/readyz") -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServeError(f"{self.command!r} exited with {self.process.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.http + path, timeout=2) as response:
                    if response.status == 200:
                        return
            time.sleep(0.3)
        raise ServeError(f"{self.command!r} not ready after {timeout_s:.0f} s:\n{self.log()}")

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise ServeError(f"{self.command!r} still running after {timeout_s:.0f} s:\n{self.log()}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        self._log.close()
        return self.process.returncode


def clean_env(**extra: str) -> dict[str, str]:
    """The environment a new user's shell has: no virtualenv of ours, no gateway settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNI_GATEWAY_", "VIRTUAL_ENV", "PYTHON"))}
    # But for one: a test's WebRTC media stays on loopback (127.0.0.1 advertised in replace mode).
    env.update(OMNI_GATEWAY_WEBRTC_ADVERTISED_ADDRESSES="127.0.0.1", OMNI_GATEWAY_WEBRTC_ADVERTISE_MODE="replace")
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(venv))
    env.update(extra)
    return env


# --- a user's turns, over raw websockets ------------------------------------------------


@contextlib.asynccontextmanager
async def realtime(url: str, headers: Mapping[str, str] | None = None) -> AsyncIterator[Any]:
    async with websockets.connect(url, additional_headers=headers, max_size=None, open_timeout=20) as ws:
        yield ws


async def next_event(ws: Any, timeout: float = 30.0) -> dict[str, Any]:
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(message, str):
            event: dict[str, Any] = orjson.loads(message)
            return event


async def until(ws: Any, type_: str, timeout: float = 60.0) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Events up to the first of ``type_``; an ``error`` event on the way fails."""
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        event = await next_event(ws, max(0.1, deadline - loop.time()))
        seen.append(event)
        if event["type"] == "error":
            raise AssertionError(f"error event: {event}")
        if event["type"] == type_:
            return event, seen


async def send(ws: Any, event: dict[str, Any]) -> None:
    await ws.send(orjson.dumps(event).decode())


async def text_turn(url: str, text: str = "hello there", headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A typed message and its answer; returns ``response.done``'s response."""
    async with realtime(url, headers) as ws:
        await until(ws, "session.created")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        await send(ws, {"type": "conversation.item.create", "item": item})
        await send(ws, {"type": "response.create"})
        done, _ = await until(ws, "response.done", timeout=120)
        response: dict[str, Any] = done["response"]
        return response


async def audio_turn(url: str, said: str = "what is your name") -> tuple[str, dict[str, Any], int]:
    """Speech in (server VAD), the answer out: (transcript heard, response, answer audio bytes)."""
    speech = await speak(said)
    async with realtime(url) as ws:
        await until(ws, "session.created")
        update = {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
        await send(ws, {"type": "session.update", "session": update})
        await until(ws, "session.updated")
        for chunk in chunks(silence(300) + speech + silence(1200)):
            await send(ws, {"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
        heard, audio = "", 0
        while True:
            event = await next_event(ws, 60)
            assert event["type"] != "error", event
            if event["type"] == "conversation.item.input_audio_transcription.completed":
                heard = event["transcript"]
            elif event["type"] == "response.output_audio.delta":
                audio += len(base64.b64decode(event["delta"]))
            elif event["type"] == "response.done":
                return heard, event["response"], audio


async def video_turn(
    http_url: str, prompt: str = "a red fox in snow", new_prompt: str = "a blue whale"
) -> dict[str, Any]:
    """A streamed video with one interaction: the events seen, by kind."""
    ws_url = http_url.replace("http://", "ws://") + "/v1/realtime/video"
    async with websockets.connect(ws_url, max_size=None, open_timeout=20) as ws:
        start = {"type": "session.start", "prompt": prompt, "width": 128, "height": 96, "fps": 12}  # until stopped
        await send(ws, start)
        started, chunk_bytes, completed, done = None, 0, [], None
        pending = 0  # bytes the last chunk_metadata announced
        while done is None:
            message = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(message, bytes):
                assert len(message) == pending, (len(message), pending)
                chunk_bytes += len(message)
                continue
            event = orjson.loads(message)
            assert event["type"] != "error", event
            if event["type"] == "video.start":
                started = event
            elif event["type"] == "video.chunk_metadata":
                pending = event["byte_length"]
                completed += event.get("completed_event_ids", [])
                if event["generation_chunk_index"] == 1:
                    interaction = {"event_id": "evt_1", "event": {"prompt": new_prompt}, "transition_chunks": 1}
                    await send(ws, {"type": "session.interaction", "interaction": interaction})
                if "evt_1" in completed:
                    await send(ws, {"type": "session.stop"})
            elif event["type"] == "session.done":
                done = event
        return {"start": started, "bytes": chunk_bytes, "completed": completed, "done": done}


async def webrtc_turn(http_url: str, said: str, workdir: Path) -> tuple[str, dict[str, Any], int]:
    """A spoken turn over a WebRTC call (server VAD): an aiortc caller whose microphone
    plays ``said`` from a WAV. (transcript heard, response.done, loud frames of answer audio)."""
    import wave

    import httpx
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from aiortc.contrib.media import MediaPlayer
    from aiortc.mediastreams import MediaStreamError

    from gateway.transport.webrtc.peer import gather_on

    pcm = silence(300) + await speak(said) + silence(1500)
    path = workdir / "said.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(pcm)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    channel = pc.createDataChannel("oai-events")
    events: list[dict[str, Any]] = []
    channel.on("message", lambda m: events.append(orjson.loads(m)))
    loud = 0

    async def listen(track: Any) -> None:
        nonlocal loud
        try:
            while True:
                frame = await track.recv()
                samples = frame.to_ndarray().astype("float64")
                loud += float((samples**2).mean()) ** 0.5 > 200
        except MediaStreamError:
            return

    tasks: list[asyncio.Task[None]] = []
    pc.on("track", lambda track: tasks.append(asyncio.ensure_future(listen(track))))
    player: MediaPlayer | None = None
    try:
        player = MediaPlayer(str(path))  # the microphone: it plays once the call connects
        assert player.audio is not None
        pc.addTrack(player.audio)
        with gather_on(("127.0.0.1",)):  # the caller's media on loopback, as the gateway's (clean_env)
            await pc.setLocalDescription(await pc.createOffer())
        session = {"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
        async with httpx.AsyncClient(timeout=30) as http:  # the unified form: the offer and the session
            r = await http.post(f"{http_url}/v1/realtime/calls", files={
                "sdp": (None, pc.localDescription.sdp, "application/sdp"),
                "session": (None, orjson.dumps(session), "application/json")})  # fmt: skip
        assert r.status_code == 201, r.text
        await pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        deadline = asyncio.get_running_loop().time() + 90
        heard = ""
        while True:
            done = next((e for e in events if e["type"] == "response.done"), None)
            if done is not None and loud > 25:
                return heard, done, loud
            for event in events:
                assert event["type"] != "error", event
                if event["type"] == "conversation.item.input_audio_transcription.completed":
                    heard = event["transcript"]
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no answer over the call; events: {[e['type'] for e in events][-20:]}")
            await asyncio.sleep(0.05)
    finally:
        for task in tasks:
            task.cancel()
        if player is not None and player.audio is not None:
            player.audio.stop()
        await pc.close()
