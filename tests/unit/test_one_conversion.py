"""One conversion of audio (docs/architecture.md, *The audio path*): whatever the transport,
what the engine hears is its audio converted once, in one stage, from the format the
transport handed the door to the engine's; and what a call plays is the engine's audio
converted once to the call's format, never through the session's client-visible formats.

Each case drives a transport's own in- or out-path (a WebRTC call's, a SIP call's RTP, a
carrier's phone call) against a real runtime and session, with an engine that records
what it is fed. It counts the conversion stages the path ran (every resampling stream the
gateway builds, every G.711 encode: the real functions, wrapped to be counted) and holds
the audio equal to one ``Converter`` of the transport's audio, to the resampler's dither
(libsoxr dithers its 16-bit output: two runs of one stream differ by up to 2 LSB). A path
through an intermediate format differs by far more: the session's G.711 by hundreds of LSB,
a stop at 24 kHz by tens. Nothing is mocked: the engine is the passthrough engine with a
microphone that records (the sockets are bound on 127.0.0.1 and never sent to).
"""

from __future__ import annotations

import asyncio
import base64
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any
from unittest.mock import ANY

import numpy as np
import orjson
import pytest
from av import AudioFrame

from gateway.audio import codecs, resample
from gateway.audio.codecs import AudioFormat, ulaw_decode, ulaw_encode
from gateway.audio.convert import Converter
from gateway.hosting.door import Door, Pending
from gateway.protocol.dialects import GA, LIVE, Dialect
from gateway.protocol.telephony import PCMU_8K, TWILIO, VONAGE, MediaIn
from gateway.runtime import Runtime
from gateway.session.events import AudioEvent, MediaEvent
from gateway.settings import Settings
from gateway.store.memory import MemoryStore
from gateway.transport.outbox import Outbox
from gateway.transport.sip.call import SipCall
from gateway.transport.sip.media import RtpMedia
from gateway.transport.sip.rtp import build_rtp
from gateway.transport.sip.sdp import Offer
from gateway.transport.telephony.call import PhoneCall
from gateway.transport.webrtc.audio_in import InboundAudio
from gateway.transport.webrtc.audio_out import AudioOutTrack
from gateway.transport.webrtc.call import Call
from gateway.transport.webrtc.config import WebRTCConfig
from gateway.transport.webrtc.peer import PeerFactory
from orchestrator.engine import AudioChunk, EngineOutput, Finished, TranscriptionRequest, Usage
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(60)

ENGINE_IN = AudioFormat("pcm16", 16000)  # what the recording engine takes (the embedded default's rate)
ENGINE_OUT = AudioFormat("pcm16", 24000)  # what it gives (the passthrough tone)
PCMU = {"type": "audio/pcmu"}
PCM24 = {"type": "audio/pcm", "rate": 24000}
DITHER_LSB = 3  # one stream's two runs differ by up to 2 (libsoxr's dither of its 16-bit output)


@dataclass
class Stages:
    """The conversion stages run since ``reset``: resampling streams built (a rate changed)
    and G.711 encodes."""

    resamplers: list[tuple[int, int]] = field(default_factory=list)
    encodes: int = 0

    def reset(self) -> None:
        self.resamplers.clear()
        self.encodes = 0


@pytest.fixture
def stages(monkeypatch: pytest.MonkeyPatch) -> Stages:
    counted = Stages()
    build = resample.StreamResampler.__init__
    encode = codecs._encode

    def counting_build(self: resample.StreamResampler, src_rate: int, dst_rate: int) -> None:
        if src_rate != dst_rate:
            counted.resamplers.append((src_rate, dst_rate))
        build(self, src_rate, dst_rate)

    def counting_encode(table: Any, pcm: bytes) -> bytes:
        counted.encodes += 1
        return encode(table, pcm)

    monkeypatch.setattr(resample.StreamResampler, "__init__", counting_build)
    monkeypatch.setattr(codecs, "_encode", counting_encode)
    return counted


def near(got: bytes, want: bytes) -> bool:
    """The same audio, to the resampler's dither."""
    a, b = np.frombuffer(got, dtype="<i2").astype(int), np.frombuffer(want, dtype="<i2").astype(int)
    return len(a) == len(b) and int(np.abs(a - b).max(initial=0)) <= DITHER_LSB


class RecordingEngine(PassthroughEngine):
    """The passthrough engine, taking 16 kHz, that keeps every byte of input audio it is fed."""

    def __init__(self) -> None:
        super().__init__(audio_chunks=25, paced=False)
        self.info = replace(self.info, input_sample_rate=ENGINE_IN.rate)
        self.heard = bytearray()
        self.finished = asyncio.Event()

    async def transcribe(self, request: TranscriptionRequest, inputs: AsyncIterator[AudioChunk]) -> AsyncIterator[
            EngineOutput]:  # fmt: skip
        async for chunk in inputs:
            self.heard += chunk.pcm
        self.finished.set()
        yield Finished(text="", usage=Usage())


@dataclass
class Client:
    """A ``Peer`` that keeps the events themselves (an ``AudioEvent`` carries the engine's audio)
    and, if it has one, hands each on to ``call`` as it comes (what a call's door does)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    call: Any = None

    def send(self, data: bytes, event: dict[str, Any] | None = None) -> None:
        if event is not None:
            self.events.append(event)
        if self.call is not None:
            self.call.send(data, event)

    def close(self, code: int, reason: str) -> None:
        pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


@pytest.fixture
async def rt() -> AsyncIterator[Runtime]:
    settings = Settings(engine="passthrough", video_engine="none", replica_id="a")
    runtime = Runtime(settings, RecordingEngine(), vad_factory=None, video_engine=None, store=MemoryStore())
    await runtime.start()
    yield runtime
    await runtime.close()


def engine_of(rt: Runtime) -> RecordingEngine:
    engine = rt.engine
    assert isinstance(engine, RecordingEngine)
    return engine


async def hand(pending: Pending) -> None:
    if pending is not None:
        await pending


async def until(check: Any, what: str) -> None:
    """Until ``check()`` holds (the session's work runs in the runtime's tasks)."""
    try:
        async with asyncio.timeout(10):
            while True:
                if check():
                    return
                await asyncio.sleep(0.005)  # (polled: the state changes in a task of the runtime's)
    except TimeoutError:
        raise AssertionError(f"no {what} in 10 s") from None


async def session(rt: Runtime, client: Client, *, input_format: dict[str, Any], output_format: dict[str, Any],
                  media: Any = None) -> Door:  # fmt: skip
    """A GA session through a door, with the client-visible formats given and no turn detection."""
    door = Door(rt.hosting, rt, client, dialect=GA, principal="key:me", model=rt.settings.model,
                max_message_bytes=rt.settings.max_message_bytes, media=media)  # fmt: skip
    assert await door.open()
    update = {"type": "session.update", "session": {"type": "realtime", "audio": {
        "input": {"format": input_format, "turn_detection": None}, "output": {"format": output_format}}}}  # fmt: skip
    await hand(door.receive(orjson.dumps(update).decode()))
    await until(lambda: bool(client.of("session.updated")), "session.updated")
    return door


async def committed(rt: Runtime, door: Door, ms: float) -> bytes:
    """Once the session's input clock holds ``ms`` of audio: commit, and what the engine heard."""
    assert door.host is not None
    host = door.host
    await until(lambda: host.session.audio_ms >= ms - 0.01, f"{ms} ms of input audio")
    await hand(door.receive('{"type": "input_audio_buffer.commit"}'))
    await asyncio.wait_for(engine_of(rt).finished.wait(), 10)
    return bytes(engine_of(rt).heard)


def once(chunks: list[bytes], src: AudioFormat, dst: AudioFormat) -> bytes:
    """``chunks`` converted in one stage, as one stream."""
    converter = Converter(src, dst)
    return b"".join(converter.process(c) for c in chunks) + converter.flush()


def signal(n: int, rate: int) -> np.ndarray:
    t = np.arange(n) / rate
    return (6000 * np.sin(2 * np.pi * 440 * t) + 3000 * np.sin(2 * np.pi * 1700 * t)).astype(np.int16)


def stereo_frame(mono: np.ndarray, pts: int) -> AudioFrame:
    frame = AudioFrame.from_ndarray(np.stack([mono, mono], axis=1).reshape(1, -1), format="s16", layout="stereo")
    frame.sample_rate = 48000
    frame.pts = pts
    return frame


def webrtc_call(dialect: Dialect = GA) -> Call:
    factory = PeerFactory(WebRTCConfig(advertised_addresses=("127.0.0.1",), advertise_mode="replace"))
    return Call("rtc_test", factory, on_ended=lambda call: None, max_message_size=65536, dialect=dialect)


# --- in: what the engine hears ------------------------------------------------------------


async def test_a_webrtc_microphone_reaches_the_engine_in_one_conversion_even_on_a_g711_session(
    rt: Runtime, stages: Stages
) -> None:
    """Opus's 48 kHz goes to the engine's 16 kHz in one step, though the session's client-visible
    input format is 8 kHz µ-law: no resampling in the transport, no G.711 round trip."""
    client = Client()
    call = webrtc_call()
    try:
        door = await session(rt, client, input_format=PCMU, output_format=PCMU, media=call)
        call.door = door
        inbound = InboundAudio()
        mic = signal(48000, 48000)  # one second
        handed: list[bytes] = []
        stages.reset()
        for i in range(50):
            for chunk, fmt in inbound.push(stereo_frame(mic[960 * i : 960 * (i + 1)], 960 * i)):
                assert fmt == AudioFormat("pcm16", 48000)
                handed.append(chunk)
                await hand(call._chunk(chunk, fmt))  # what the call's AudioIn does with each chunk
        heard = await committed(rt, door, 1000)
        assert stages.resamplers == [(48000, 16000)] and stages.encodes == 0  # one stage, no G.711
        assert near(heard, once(handed, AudioFormat("pcm16", 48000), ENGINE_IN))
    finally:
        await call.end("test over")


async def test_a_sip_callers_g711_reaches_the_engine_in_one_conversion(rt: Runtime, stages: Stages) -> None:
    """The RTP payload, µ-law at 8 kHz, goes to the engine's 16 kHz in one step (not through the
    session's 24 kHz PCM16, its client-visible input format)."""
    client = Client()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    offer = Offer(address="127.0.0.1", port=9, payload_type=0, dtmf_type=None, ptime_ms=20)
    media = RtpMedia(sock, offer, on_audio=lambda audio: None, on_dtmf=lambda key: None)
    call = SipCall("ringing", media, on_close=lambda call, reason: None)
    try:
        door = await session(rt, client, input_format=PCM24, output_format=PCM24, media=call)
        call.start(door)
        payload = ulaw_encode(signal(8000, 8000).tobytes())
        packets = [payload[160 * i : 160 * (i + 1)] for i in range(50)]
        stages.reset()
        for i, chunk in enumerate(packets):
            media.received(build_rtp(0, i, 160 * i, 1234, chunk), ("127.0.0.1", 9))
        heard = await committed(rt, door, 1000)
        assert stages.resamplers == [(8000, 16000)] and stages.encodes == 0
        assert near(heard, once(packets, PCMU_8K, ENGINE_IN))
    finally:
        await call.end("test over")


async def test_a_phone_callers_mulaw_reaches_the_engine_in_one_conversion_whatever_the_session_says(
    rt: Runtime, stages: Stages
) -> None:
    """A carrier's µ-law goes to the engine in one step, even when the session's input format is
    no longer the carrier's (a sideband changed it): no decode and re-encode on the way."""
    client = Client()
    outbox = Outbox(lambda *a: asyncio.sleep(0), max_bytes=1 << 20)
    call = PhoneCall(TWILIO, "MZ1", "CA1", outbox, PCMU_8K)
    door = await session(rt, client, input_format=PCM24, output_format=PCMU, media=call)
    call.door = door
    payload = ulaw_encode(signal(8000, 8000).tobytes())
    chunks = [payload[160 * i : 160 * (i + 1)] for i in range(50)]
    stages.reset()
    for chunk in chunks:
        await hand(call.handle(MediaIn(chunk, None)))
    heard = await committed(rt, door, 1000)
    assert stages.resamplers == [(8000, 16000)] and stages.encodes == 0
    assert near(heard, once(chunks, PCMU_8K, ENGINE_IN))
    call.end("test over", code=None)  # (the door detached: the runtime's close waits for no call)


async def test_a_vonage_callers_16_khz_reaches_a_16_khz_engine_unconverted(rt: Runtime, stages: Stages) -> None:
    """Linear PCM at 16 kHz: the session shows its clients audio/pcm at 24 kHz (the Realtime
    schema's only rate), yet the caller's audio reaches the 16 kHz engine as it came, with no
    resampling at all (before: 16 -> 24 kHz in the call, 24 -> 16 kHz in the session)."""
    client = Client()
    outbox = Outbox(lambda *a: asyncio.sleep(0), max_bytes=1 << 20)
    linear16 = AudioFormat("pcm16", 16000)
    call = PhoneCall(VONAGE, "v1", "v1", outbox, linear16)
    door = await session(rt, client, input_format=PCM24, output_format=PCM24, media=call)
    call.door = door
    pcm = signal(16000, 16000).tobytes()
    chunks = [pcm[640 * i : 640 * (i + 1)] for i in range(50)]
    stages.reset()
    for chunk in chunks:
        await hand(call.handle(MediaIn(chunk, None)))
    heard = await committed(rt, door, 1000)
    assert stages.resamplers == [] and stages.encodes == 0
    assert heard == pcm  # byte for byte: nothing was converted
    call.end("test over", code=None)


# --- out: what the call plays ----------------------------------------------------------------


async def answered(rt: Runtime, door: Door, client: Client) -> list[dict[str, Any]]:
    """A response's audio events, once it is done."""
    await hand(door.receive('{"type": "response.create"}'))
    await until(lambda: bool(client.of("response.done")), "the answer")
    return client.of("response.output_audio.delta")


async def test_the_engines_audio_rides_beside_the_clients_g711_delta(rt: Runtime) -> None:
    """A G.711 session's deltas are µ-law for its clients; each also carries the engine's own
    audio, whole and unconverted, for a call to convert once."""
    client = Client()
    door = await session(rt, client, input_format=PCMU, output_format=PCMU)
    deltas = await answered(rt, door, client)
    assert deltas and all(isinstance(e, AudioEvent) for e in deltas)
    assert {e.source[1] for e in deltas if isinstance(e, AudioEvent)} == {ENGINE_OUT}
    engine = engine_of(rt)
    spoken = b"".join(e.source[0] for e in deltas if isinstance(e, AudioEvent))
    assert spoken == engine._chunk * engine.audio_chunks  # the tone, every chunk, as the engine gave it
    ulaw = b"".join(e["delta"] for e in deltas)
    assert len(ulaw) == 8 * 20 * engine.audio_chunks  # (the client's µ-law: every ms of it)


def frames_of(track: AudioOutTrack) -> Any:
    """A track whose clock moves only when it waits: its frames, as fast as they are asked for."""
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    track._clock = lambda: now[0]
    track._sleep = sleep
    return track


async def played(track: AudioOutTrack, until_ms: int) -> bytes:
    pcm = bytearray()
    for _ in range(until_ms // 20):
        frame = await track.recv()
        pcm += frame.to_ndarray().tobytes()
    return bytes(pcm)


async def test_a_webrtc_call_plays_the_engines_audio_converted_once_not_the_sessions_g711(
    rt: Runtime, stages: Stages
) -> None:
    client = Client()
    call = webrtc_call()
    try:
        frames_of(call.track)
        door = await session(rt, client, input_format=PCMU, output_format=PCMU, media=call)
        call.door = door
        deltas = await answered(rt, door, client)
        stages.reset()
        for event in client.events:
            call.send(orjson.dumps(event, default=bytes.hex), event)  # what the door's delivery does
        assert stages.resamplers == [(24000, 48000)] and stages.encodes == 0  # (no µ-law decoded)
        engine = engine_of(rt)
        want = once([e.source[0] for e in deltas if isinstance(e, AudioEvent)], ENGINE_OUT, AudioFormat("pcm16", 48000))
        assert len(want) == 2 * 48 * 20 * engine.audio_chunks  # every ms of the answer, at the track's 48 kHz
        assert near(await played(call.track, 20 * engine.audio_chunks), want)
    finally:
        await call.end("test over")


def sip_call() -> tuple[SipCall, RtpMedia, socket.socket]:
    """A SIP call on a μ-law line (its RTP socket on loopback; its track's clock is the test's)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    offer = Offer(address="127.0.0.1", port=9, payload_type=0, dtmf_type=None, ptime_ms=20)
    media = RtpMedia(sock, offer, on_audio=lambda audio: None, on_dtmf=lambda key: None)
    frames_of(media.track)
    return SipCall("ringing", media, on_close=lambda call, reason: None), media, sock


async def test_a_sip_call_plays_the_engines_audio_converted_once(rt: Runtime, stages: Stages) -> None:
    client = Client()
    call, media, sock = sip_call()
    try:
        door = await session(rt, client, input_format=PCMU, output_format={"type": "audio/pcma"}, media=call)
        call.door = door
        deltas = await answered(rt, door, client)
        stages.reset()
        for event in client.events:
            call.send(b"", event)
        assert stages.resamplers == [(24000, 8000)] and stages.encodes == 0  # (the A-law deltas are not decoded)
        engine = engine_of(rt)
        want = once([e.source[0] for e in deltas if isinstance(e, AudioEvent)], ENGINE_OUT, AudioFormat("pcm16", 8000))
        assert len(want) == 2 * 8 * 20 * engine.audio_chunks
        assert near(await played(media.track, 20 * engine.audio_chunks), want)
    finally:
        await call.end("test over")
        sock.close()


def test_a_converter_is_one_stage_and_the_identity_costs_nothing(stages: Stages) -> None:
    pcm = signal(2400, 24000).tobytes()
    same = Converter(ENGINE_OUT, ENGINE_OUT)
    assert same.identity and same.process(pcm) is pcm and same.flush() == b""
    assert stages.resamplers == [] and stages.encodes == 0  # the identity is no stage
    to_ulaw = Converter(AudioFormat("pcm16", 8000), PCMU_8K)  # a codec, no rate change
    assert to_ulaw.process(pcm[:4001]) == ulaw_encode(pcm[:4000])  # an odd byte waits for its partner
    assert to_ulaw.process(pcm[4001:4003]) == ulaw_encode(pcm[4000:4002])
    assert stages.resamplers == []
    down = Converter(ENGINE_OUT, PCMU_8K)  # both at once: one stream
    assert len(down.process(pcm) + down.flush()) == 800 and stages.resamplers == [(24000, 8000)]


async def live_answer(rt: Runtime, client: Client, call: Any) -> list[AudioEvent]:
    """A Live session on ``call`` (its door's media, ``client`` its peer) says a commentary: its
    answer's audio events, once its end reached the call (``response.done``, the call's alone)."""
    door = Door(rt.hosting, rt, client, dialect=LIVE, principal="key:me", model=rt.settings.model,
                max_message_bytes=rt.settings.max_message_bytes, media=call)  # fmt: skip
    assert await door.open_media({"model": rt.settings.model}) is None
    call.start(door)  # (its dialect's audio event: the Live one)
    say = {"type": "session.commentary.append", "content": "one two three", "delegation_id": None}
    await hand(door.receive(orjson.dumps(say).decode()))
    await until(lambda: bool(client.of("response.done")), "the answer's end")
    assert client.of("response.done") == [{"type": "response.done", "response": {}, "server_event_seq": ANY}]
    assert isinstance(client.of("response.done")[0], MediaEvent)  # (never on a Live wire)
    deltas = client.of("session.output_audio.delta")
    assert len(deltas) == engine_of(rt).audio_chunks and all(isinstance(e, AudioEvent) for e in deltas)
    assert {e.source[1] for e in deltas if isinstance(e, AudioEvent)} == {ENGINE_OUT}
    return [e for e in deltas if isinstance(e, AudioEvent)]


def fed_to(track: Any) -> bytearray:
    """What is fed to ``track`` (a call's track or playout) from now on (the feed still runs)."""
    fed = bytearray()
    feed = track.feed

    def recording(audio: bytes, **where: str) -> None:
        fed.extend(audio)
        feed(audio, **where)

    track.feed = recording
    return fed


async def test_a_live_sessions_answer_plays_whole_on_a_sip_call_converted_once(rt: Runtime, stages: Stages) -> None:
    """GPT-Live on a phone line (a media connection: its output is not paced by the session,
    the call paces it): each ``session.output_audio.delta`` carries the engine's own audio, and
    the call converts it once, 24 kHz to the line's 8 kHz, never the session's PCM again. The
    answer's end (which the Live dialect tells its clients nothing of) reaches the call: what
    its converter held (its filter's last ms) is played then, not at the next speech, and the
    answer's stream ends on the track."""
    call, media, sock = sip_call()
    client = Client(call=call)
    stopped: list[str] = []
    media.track.on_stopped = stopped.append  # (a Live call reports nothing of it: the track says it here)
    fed = fed_to(media.track)
    try:
        stages.reset()
        deltas = await live_answer(rt, client, call)
        assert stages.resamplers == [(24000, 8000)] and stages.encodes == 0
        want = once([e.source[0] for e in deltas], ENGINE_OUT, AudioFormat("pcm16", 8000))
        assert len(want) == 2 * 8 * 20 * engine_of(rt).audio_chunks  # every ms of the answer, at 8 kHz
        assert len(fed) == len(want) and near(bytes(fed), want)  # all of it on the track at the answer's end
        assert near(await played(media.track, 20 * engine_of(rt).audio_chunks), want)
        assert stopped == ["speech0"] and media.track.playing is None
    finally:
        await call.end("test over")
        sock.close()


ULAW_LEVELS = np.unique(np.frombuffer(ulaw_decode(bytes(range(256))), dtype="<i2"))


def near_ulaw(got: bytes, want: bytes) -> bool:
    """The same µ-law audio, to the resampler's dither (which may move a sample one level)."""
    a, b = (np.searchsorted(ULAW_LEVELS, np.frombuffer(ulaw_decode(x), dtype="<i2")) for x in (got, want))
    return len(a) == len(b) and int(np.abs(a - b).max(initial=0)) <= 1


async def test_a_live_sessions_answer_reaches_a_twilio_stream_whole_converted_once(rt: Runtime, stages: Stages) -> None:
    """The same on a carrier's media stream: the engine's 24 kHz PCM converted once to the
    stream's µ-law, and at the answer's end the converter's last ms go out after the rest (in
    ``media`` messages, each followed by its ``mark``), not at the next speech."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(orjson.loads(message["text"]))

    outbox = Outbox(send, max_bytes=1 << 20)
    writer = asyncio.get_running_loop().create_task(outbox.run())
    call = PhoneCall(TWILIO, "MZ1", "CA1", outbox, PCMU_8K)
    client = Client(call=call)
    fed = fed_to(call.playout)
    try:
        stages.reset()
        deltas = await live_answer(rt, client, call)
        assert stages.resamplers == [(24000, 8000)]  # (and its µ-law encoded as it comes)
        want = once([e.source[0] for e in deltas], ENGINE_OUT, PCMU_8K)
        assert len(want) == 8 * 20 * engine_of(rt).audio_chunks
        assert len(fed) == len(want) and near_ulaw(bytes(fed), want)  # all of it queued at the answer's end
        await until(lambda: not call.playout.queued_ms and not outbox.queued_bytes, "the answer sent")
        payloads = [base64.b64decode(m["media"]["payload"]) for m in sent if m["event"] == "media"]
        assert near_ulaw(b"".join(payloads), want)
        assert [m["event"] for m in sent] == ["media", "mark"] * len(payloads)
    finally:
        call.end("test over", code=None)
        writer.cancel()


def fed_to_channel(call: Call) -> list[bytes]:
    """What ``call`` sends on its data channel from now on (the channel still sends it)."""
    sent: list[bytes] = []
    send = call.channel.send

    def recording(event: Any) -> bool:
        sent.append(event)
        return send(event)

    call.channel.send = recording  # type: ignore[method-assign]
    return sent


async def test_a_live_sessions_answer_plays_whole_on_a_webrtc_call(rt: Runtime, stages: Stages) -> None:
    """And on a Live WebRTC call's track (48 kHz): the whole answer at its end, the track's
    stream ended; the answer's end is the call's, never sent on its data channel."""
    call = webrtc_call(LIVE)
    frames_of(call.track)
    client = Client(call=call)
    channel = fed_to_channel(call)
    stopped: list[str] = []
    call.track.on_stopped = stopped.append
    fed = fed_to(call.track)
    try:
        stages.reset()
        deltas = await live_answer(rt, client, call)
        assert stages.resamplers == [(24000, 48000)] and stages.encodes == 0
        want = once([e.source[0] for e in deltas], ENGINE_OUT, AudioFormat("pcm16", 48000))
        assert len(want) == 2 * 48 * 20 * engine_of(rt).audio_chunks
        assert len(fed) == len(want) and near(bytes(fed), want)
        assert near(await played(call.track, 20 * engine_of(rt).audio_chunks), want)
        assert stopped == ["speech0"]
        assert channel and all(data and b'"response.done"' not in data for data in channel)
    finally:
        await call.end("test over")
