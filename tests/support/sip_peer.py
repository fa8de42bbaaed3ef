"""Test support for SIP calls: sipp as the trunk's signaling, and a small RTP peer in Python as
its media (on 127.0.0.1 only). The scenarios are tests/sip/scenarios/*.xml."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shutil
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gateway.audio.codecs import AudioFormat, decode_to_pcm16, encode_from_pcm16
from gateway.transport.sip.rtp import build_dtmf, build_rtp, parse_rtp

SCENARIOS = Path(__file__).resolve().parent.parent / "sip" / "scenarios"
SIPP = shutil.which("sipp")
ULAW = AudioFormat("pcmu", 8000)
FRAME = 160  # samples per 20 ms at 8 kHz


class _Proto(asyncio.DatagramProtocol):
    def __init__(self, peer: RtpPeer) -> None:
        self.peer = peer

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.peer._received(data, addr)


class OpusPeerCodec:
    """The peer's Opus (RFC 7587): aiortc's own encoder and decoder, not the gateway's, so a
    mistake in the gateway's codec is not mirrored here. PCM16 mono at 48 kHz in and out."""

    rate = 48000

    def __init__(self) -> None:
        from aiortc.codecs.opus import OpusDecoder, OpusEncoder

        self._enc, self._dec = OpusEncoder(), OpusDecoder()
        self._pts = 0

    def encode(self, pcm: bytes) -> bytes:
        from av import AudioFrame

        frame = AudioFrame.from_ndarray(np.frombuffer(pcm, dtype="<i2").reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = self.rate, self._pts
        self._pts += len(pcm) // 2
        payloads, _ = self._enc.encode(frame)
        return b"".join(payloads)

    def decode(self, payload: bytes, timestamp: int) -> bytes:
        from aiortc.jitterbuffer import JitterFrame

        frames = self._dec.decode(JitterFrame(data=payload, timestamp=timestamp))
        stereo = b"".join(f.to_ndarray().tobytes() for f in frames)  # type: ignore[attr-defined]
        return np.frombuffer(stereo, dtype="<i2")[0::2].tobytes()  # (left: libopus decodes mono to both)


def srtp_session(key: bytes, *, inbound: bool, suite: str = "AES_CM_128_HMAC_SHA1_80") -> Any:
    """A pylibsrtp session for the peer's side of SDES-SRTP: ``key`` is key||salt (30 bytes)."""
    import pylibsrtp

    profile = {"AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
               "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32}[suite]  # fmt: skip
    kind = pylibsrtp.Policy.SSRC_ANY_INBOUND if inbound else pylibsrtp.Policy.SSRC_ANY_OUTBOUND
    return pylibsrtp.Session(pylibsrtp.Policy(key=key, ssrc_type=kind, srtp_profile=profile))


@dataclass
class RtpPeer:
    """The caller's RTP: sends μ-law (paced, 20 ms a packet) and RFC 4733 keys, keeps what it hears.
    ``opus``: Opus at 48 kHz on ``payload_type`` instead; ``srtp_tx``/``srtp_rx`` (pylibsrtp
    sessions, ``srtp_session``): SRTP both ways (what fails to unprotect: ``undecryptable``)."""

    port: int = 0
    remote: tuple[str, int] | None = None  # learnt from the gateway's first packet (symmetric RTP)
    heard: list[bytes] = field(default_factory=list)  # PCM16 8 kHz of each packet received
    _transport: asyncio.DatagramTransport | None = None
    _got_remote: asyncio.Event = field(default_factory=asyncio.Event)
    _loud: asyncio.Event = field(default_factory=asyncio.Event)
    loud_frames: int = 0
    loud_needed: int = 25
    _seq: int = 0
    _ts: int = 0
    ssrc: int = field(default_factory=lambda: secrets.randbits(32))
    keys: list[str] = field(default_factory=list)  # RFC 4733 keys the gateway sent (each once, at its end)
    _key_ends: set[int] = field(default_factory=set)  # timestamps of the keys taken
    _got_key: asyncio.Event = field(default_factory=asyncio.Event)
    dtmf_pt: int = 101  # the telephone-event payload type the scenarios' SDP names
    payload_type: int = 0
    opus: OpusPeerCodec | None = None
    srtp_tx: Any = None
    srtp_rx: Any = None
    undecryptable: int = 0

    @property
    def rate(self) -> int:
        return self.opus.rate if self.opus is not None else 8000

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _Proto(self), local_addr=("127.0.0.1", 0))
        self._transport = transport  # type: ignore[assignment]
        self.port = transport.get_extra_info("sockname")[1]

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.srtp_rx is not None:
            import pylibsrtp

            try:
                data = self.srtp_rx.unprotect(data)
            except pylibsrtp.Error:
                self.undecryptable += 1
                return
        packet = parse_rtp(data)
        if packet is not None and packet.payload_type == self.dtmf_pt and len(packet.payload) >= 4:
            # RFC 4733 2.3: event, E bit, volume, duration; a key counts once its end comes.
            event, ended = packet.payload[0], bool(packet.payload[1] & 0x80)
            if ended and event < 16 and packet.timestamp not in self._key_ends:
                self._key_ends.add(packet.timestamp)
                self.keys.append("0123456789*#ABCD"[event])
                self._got_key.set()
            return
        if packet is None or packet.payload_type != self.payload_type:
            return
        if self.remote is None:
            self.remote = addr
            self._got_remote.set()
        if self.opus is not None:
            pcm = self.opus.decode(packet.payload, packet.timestamp)
        else:
            pcm = decode_to_pcm16(ULAW, packet.payload)
        self.heard.append(pcm)
        rms = float(np.sqrt(np.mean(np.frombuffer(pcm, dtype="<i2").astype(np.float64) ** 2)))
        if rms > 300:
            self.loud_frames += 1
            if self.loud_frames >= self.loud_needed:
                self._loud.set()

    async def wait_remote(self, timeout: float = 60.0) -> tuple[str, int]:
        await asyncio.wait_for(self._got_remote.wait(), timeout)
        assert self.remote is not None
        return self.remote

    async def wait_key(self, timeout: float = 30.0) -> str:
        """The next key the gateway sent (telephone-events), once its end came."""
        while not self.keys:
            self._got_key.clear()
            await asyncio.wait_for(self._got_key.wait(), timeout)
        return self.keys.pop(0)

    async def wait_answer_audio(self, timeout: float = 120.0) -> None:
        """Until ``loud_needed`` packets of speech-loud audio came back (0.5 s by default)."""
        await asyncio.wait_for(self._loud.wait(), timeout)

    def packet(self, pt: int, payload: bytes, *, ts: int | None = None, marker: bool = False,
               protect: bool = True) -> bytes:  # fmt: skip
        """The next packet, as sent (SRTP-protected where ``srtp_tx`` is set, unless not ``protect``)."""
        self._seq = (self._seq + 1) & 0xFFFF
        data = build_rtp(pt, self._seq, self._ts if ts is None else ts, self.ssrc, payload, marker=marker)
        return data if self.srtp_tx is None or not protect else bytes(self.srtp_tx.protect(data))

    def send_raw(self, data: bytes) -> None:
        assert self._transport is not None and self.remote is not None
        self._transport.sendto(data, self.remote)

    def _send(self, pt: int, payload: bytes, *, ts: int | None = None, marker: bool = False) -> None:
        self.send_raw(self.packet(pt, payload, ts=ts, marker=marker))

    async def play(self, pcm: bytes) -> None:
        """Send PCM16 at the peer's rate (8 kHz μ-law; 48 kHz Opus), one packet per 20 ms of the
        loop's clock."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        samples = self.rate // 50
        step = 2 * samples
        for n, i in enumerate(range(0, len(pcm), step)):
            frame = pcm[i : i + step].ljust(step, b"\0")
            payload = self.opus.encode(frame) if self.opus is not None else encode_from_pcm16(ULAW, frame)
            if payload:
                self._send(self.payload_type, payload)
            self._ts += samples
            delay = start + (n + 1) * 0.02 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

    async def press(self, key: str, pt: int = 101) -> None:
        """One key press as RFC 4733 events: three updates, then the end sent three times."""
        ts = self._ts
        for n in range(3):
            self._send(pt, build_dtmf(key, end=False, duration=FRAME * (n + 1)), ts=ts, marker=n == 0)
            await asyncio.sleep(0.02)
        for _ in range(3):
            self._send(pt, build_dtmf(key, end=True, duration=FRAME * 4), ts=ts)
        self._ts += FRAME * 5


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Sipp:
    process: asyncio.subprocess.Process
    port: int  # sipp's own SIP port
    call_id: str  # the SIP Call-ID of its call (-cid_str)
    messages: Path  # what it sent and received (-trace_msg)
    log: Path

    async def wait(self, timeout: float = 120.0) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout)

    def omni_call_id(self) -> str | None:
        """The session's call id the gateway named in its 200 OK (X-Omni-Call-Id), once received."""
        if not self.messages.exists():
            return None
        match = re.search(r"X-Omni-Call-Id: ((?:rtc|live)_[0-9a-f]+)", self.messages.read_text(errors="replace"))
        return match.group(1) if match else None

    async def wait_omni_call_id(self, timeout: float = 60.0) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            found = self.omni_call_id()
            if found:
                return found
            if self.process.returncode is not None:
                raise AssertionError(f"sipp ended ({self.process.returncode}) before the 200 OK: {self.text()}")
            await asyncio.sleep(0.05)
        raise AssertionError("no 200 OK naming the call: " + self.text())

    def text(self) -> str:
        parts = [p.read_text(errors="replace") for p in (self.log, self.messages) if p.exists()]
        return "\n".join(parts)[-4000:]

    def sip_call_id(self) -> str | None:
        """The Call-ID of the first INVITE sipp received (a trunk's: the gateway's outbound call)."""
        if not self.messages.exists():
            return None
        match = re.search(r"^INVITE .*?^Call-ID: *(\S+)", self.messages.read_text(errors="replace"), re.M | re.S)
        return match.group(1) if match else None

    async def wait_invite(self, timeout: float = 30.0) -> None:
        """Until sipp received an INVITE; its Call-ID is then ``call_id`` (for ``send_info``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (found := self.sip_call_id()) is None:
            if loop.time() > deadline or self.process.returncode is not None:
                raise AssertionError("no INVITE reached sipp: " + self.text())
            await asyncio.sleep(0.05)
        self.call_id = found

    def send_info(self) -> None:
        """An INFO in sipp's dialog (over UDP): the scenario's cue (to hang up, to answer)."""
        info = (
            f"INFO sip:caller@127.0.0.1:{self.port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:9;branch=z9hG4bK{secrets.token_hex(6)}\r\n"
            "From: <sip:test@127.0.0.1>;tag=cue\r\nTo: <sip:caller@127.0.0.1>\r\n"
            f"Call-ID: {self.call_id}\r\nCSeq: 9 INFO\r\nContent-Length: 0\r\n\r\n"
        ).encode()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(info, ("127.0.0.1", self.port))


@contextlib.asynccontextmanager
async def sipp_uas(scenario: str, rtp_port: int, tmp: Path, *, extra: tuple[str, ...] = ()) -> AsyncIterator[Sipp]:
    """sipp as a trunk that answers one call on 127.0.0.1 (its port: ``.port``)."""
    assert SIPP is not None, "sipp is not installed (Debian's sip-tester)"
    port = free_udp_port()
    messages, log = tmp / f"sipp-uas-{port}-messages.log", tmp / f"sipp-uas-{port}.log"
    args = [SIPP, "-sf", str(SCENARIOS / scenario), "-i", "127.0.0.1", "-p", str(port), "-m", "1",
            "-key", "rtp_port", str(rtp_port), "-mi", "127.0.0.1", "-trace_msg", "-message_file", str(messages),
            "-trace_err", "-error_file", str(log), "-timeout", "150s", "-timeout_error", "-nostdin",
            *extra]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    run = Sipp(proc, port, "", messages, log)
    try:
        yield run
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def sipp(scenario: str, gateway_port: int, rtp_port: int, tmp: Path, *, transport: str = "u1",
               calls: int = 1, rate: float = 1.0, extra: tuple[str, ...] = ()) -> AsyncIterator[Sipp]:  # fmt: skip
    """sipp placing ``calls`` calls of ``scenario`` at the gateway, from 127.0.0.1."""
    assert SIPP is not None, "sipp is not installed (Debian's sip-tester)"
    port = free_udp_port()
    call_id = f"omni-{secrets.token_hex(6)}@127.0.0.1"
    messages, log = tmp / f"sipp-{port}-messages.log", tmp / f"sipp-{port}.log"
    args = [
        SIPP, f"127.0.0.1:{gateway_port}", "-sf", str(SCENARIOS / scenario), "-i", "127.0.0.1", "-p", str(port),
        "-m", str(calls), "-r", str(rate), "-t", transport, "-key", "rtp_port", str(rtp_port),
        "-mi", "127.0.0.1", "-trace_msg", "-message_file", str(messages), "-trace_err", "-error_file", str(log),
        "-timeout", "150s", "-timeout_error", "-nostdin", *extra,
    ]  # fmt: skip
    if calls == 1:
        args += ["-cid_str", call_id]
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)  # fmt: skip
    run = Sipp(proc, port, call_id, messages, log)
    try:
        yield run
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


OFFER = (
    "v=0\r\no=caller 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio {port} {profile} 0 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
)


class _Uac(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.inbox: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.inbox.put_nowait(data)


@dataclass
class SipUac:
    """A minimal SIP caller over UDP for the cases sipp's scenarios do not cover (a status
    the call control chooses, CANCEL, the caps): it writes requests and reads what comes."""

    gateway: tuple[str, int]
    transport: asyncio.DatagramTransport
    proto: _Uac
    port: int
    call_id: str = field(default_factory=lambda: f"uac-{secrets.token_hex(6)}@127.0.0.1")
    branch: str = field(default_factory=lambda: "z9hG4bK" + secrets.token_hex(6))

    @classmethod
    async def open(cls, gateway_port: int, host: str = "127.0.0.1") -> SipUac:
        loop = asyncio.get_running_loop()
        transport, proto = await loop.create_datagram_endpoint(_Uac, local_addr=(host, 0))
        return cls(("127.0.0.1", gateway_port), transport, proto, transport.get_extra_info("sockname")[1])

    def close(self) -> None:
        self.transport.close()

    def request(self, method: str, *, body: str = "", cseq: int = 1, to_tag: str | None = None,
                headers: tuple[str, ...] = ()) -> None:  # fmt: skip
        to = "<sip:agent@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
        head = (
            f"{method} sip:agent@127.0.0.1:{self.gateway[1]} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch={self.branch}\r\n"
            f"From: <sip:caller@127.0.0.1>;tag=uac\r\nTo: {to}\r\nCall-ID: {self.call_id}\r\n"
            f"CSeq: {cseq} {method}\r\nContact: <sip:caller@127.0.0.1:{self.port}>\r\nMax-Forwards: 70\r\n"
        )
        head += "".join(f"{h}\r\n" for h in headers)
        if body:
            head += "Content-Type: application/sdp\r\n"
        self.transport.sendto(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode(), self.gateway)

    def invite(self, rtp_port: int = 40000, profile: str = "RTP/AVP", *, cseq: int = 1,
               headers: tuple[str, ...] = ()) -> None:  # fmt: skip
        self.request("INVITE", body=OFFER.format(port=rtp_port, profile=profile), cseq=cseq, headers=headers)

    async def response(self, timeout: float = 30.0, *, final: bool = True) -> tuple[int, str]:
        """The next response (a final one, >= 200, unless ``final`` is false): (status, the whole message)."""
        while True:
            data = (await asyncio.wait_for(self.proto.inbox.get(), timeout)).decode()
            if not data.startswith("SIP/2.0 "):
                continue
            status = int(data.split(" ", 2)[1])
            if status >= 200 or not final:
                return status, data

    async def request_in(self, method: str, timeout: float = 30.0) -> str:
        """The next request of ``method`` the gateway sends us."""
        while True:
            data = (await asyncio.wait_for(self.proto.inbox.get(), timeout)).decode()
            if data.startswith(method + " "):
                return data

    def ack(self, to_tag: str | None) -> None:
        self.request("ACK", to_tag=to_tag)

    def respond(self, request: str, status: int, reason: str) -> None:
        """Answer a request the gateway sent us (its Via, From, To, Call-ID and CSeq copied)."""
        copied = [line for line in request.split("\r\n")
                  if line.split(":", 1)[0].lower() in ("via", "from", "to", "call-id", "cseq")]  # fmt: skip
        head = "".join(f"{line}\r\n" for line in copied)
        self.transport.sendto(f"SIP/2.0 {status} {reason}\r\n{head}Content-Length: 0\r\n\r\n".encode(), self.gateway)

    def nothing_waiting(self) -> bool:
        return self.proto.inbox.empty()


def post_json(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    """POST ``body`` as JSON (a REST call control request): the status and the JSON answer."""
    req = urllib.request.Request(url, data=orjson.dumps(body), method="POST",
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status), orjson.loads(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), orjson.loads(err.read())
