"""Issue 33's attacks against real ``serve --engine passthrough`` processes: /healthz and RSS under each.

Each attack runs for a while against a gateway process of its own (its log in the run
directory) while ``/healthz`` is probed every 100 ms from a process of its own (the
attackers' busy loop must not delay the probe), and the gateway's RSS is sampled. Printed
per attack: probes answered / sent, the slowest and the p99 answer, RSS before, at its
peak and after, the CPU the gateway used (little CPU beside slow probes: the machine, not
the gateway, was busy; the load average is printed too), and what the gateway did with
the attack:

- ``drip``: 512 connections without a credential, each dripping a body into
  ``POST /v1/realtime/calls`` (``Content-Length: 100000``, a byte a second; opened 32 every
  100 ms), and 64 with a tenant key dripping into ``client_secrets``: how many were
  answered (401 at once; 408 at ``request_timeout_s``, 30 s, when the attack lasts that
  long; 503 past ``max_request_bodies``);
- ``mcp``: six ``session.update`` naming 128 MCP servers each (a server that accepts and
  never answers, half of them over ``https://``): the most listings that held a connection
  at once, and how many were made at all;
- ``images``: 960 items of a 3 KB PNG declaring 5000 x 5000 pixels in one conversation,
  then ``response.create``, against a gateway in this process whose engine decodes every
  image it is given (as the ``vllm`` engine does): the images the conversation kept, what
  the response decoded, RSS (this process's);
- ``video``: 200 interactions POSTed with a 1 MiB ``event_id`` and 200 with a 256-character
  one, as fast as they go: what was refused (400, 429);
- ``relay``: two replicas on one Redis whose pub/sub output buffer limit is 1 MB, a call
  on replica A (an aiortc "browser" here) and its sideband on replica B flooding
  1.5 MB messages and 60 KB ones for 15 s: /healthz of the call's replica, and the
  clients Redis closed for their output buffer (its log; must stay 0).

    python bench/attacks.py                  # every attack, about 3 minutes (the drip lasts 35 s)
    python bench/attacks.py --only drip mcp
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import multiprocessing as mp
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.gateway import free_port  # noqa: E402

KEY = "sk-bench-attacks-operator"
RSS_GUARD = 4 << 30  # an attack that takes the gateway past this is stopped (the process killed)
TENANT = "sk-bench-attacks-tenant"


def sha(value: str) -> str:
    import hashlib

    return hashlib.sha256(value.encode()).hexdigest()


KEYS_FILE = orjson.dumps({"tenants": [{"name": "t", "key_sha256": sha(TENANT), "limits": {"events_per_s": 20}}]})


def start_gateway(port: int, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full = {**os.environ, "OMNI_GATEWAY_PORT": str(port), "OMNI_GATEWAY_API_KEYS": KEY,
            "OMNI_GATEWAY_KEYS_FILE": KEYS_FILE.decode(), "OMNI_GATEWAY_WORKERS": "1", **(env or {})}  # fmt: skip
    out = log.open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--engine", "passthrough"],
                            cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the gateway did not start; see {log}")


def health_probe(port: int, stop: Any, path: Path) -> None:
    """In its own process: GET /healthz every 100 ms, 5 s to answer; a line per probe."""
    with path.open("a", buffering=1) as out:
        while not stop.is_set():
            began = time.perf_counter()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                    sock.settimeout(5)
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    status = sock.makefile("rb").readline()
                failure = "" if b" 200 " in status else status.decode(errors="replace").strip() or "no answer"
            except OSError as exc:
                failure = repr(exc)
            out.write(f"{time.perf_counter() - began:.6f} {failure}\n" if failure or time.perf_counter() - began < 0.5
                      else f"{time.perf_counter() - began:.6f}  \n")  # fmt: skip
            if time.perf_counter() - began >= 0.5:
                print(f"        slow probe at {time.time():.1f}: {time.perf_counter() - began:.3f} s", flush=True)
            time.sleep(max(0.0, 0.1 - (time.monotonic() % 0.1)))


class Watch:
    """/healthz probes (another process) and RSS samples (a thread) while an attack runs."""

    def __init__(self, port: int, pid: int, run: Path, name: str) -> None:
        self.port, self.proc, self.path = port, psutil.Process(pid), run / f"probes-{name}.txt"
        self.rss_before = self.proc.memory_info().rss
        self.rss_peak = self.rss_before
        self.cpu_before = sum(self.proc.cpu_times()[:2])
        self.began = time.monotonic()
        self._stop = mp.Event()
        self._probe = mp.Process(target=health_probe, args=(port, self._stop, self.path), daemon=True)
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while self._sampling:
            with contextlib.suppress(psutil.Error):
                self.rss_peak = max(self.rss_peak, self.proc.memory_info().rss)
            if self.rss_peak > RSS_GUARD:  # (unbounded: a gateway without issue 33's bounds takes the machine)
                print(f"RSS past {RSS_GUARD >> 30} GiB: stopping before the machine runs out", flush=True)
                with contextlib.suppress(psutil.Error):
                    if self.proc.pid != os.getpid():
                        self.proc.kill()
                os._exit(3)
            time.sleep(0.05)

    def __enter__(self) -> Watch:
        self._probe.start()
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._probe.join(10)
        self._sampling = False
        self._sampler.join(5)

    def report(self, name: str, outcome: str) -> None:
        lines = [line.split(" ", 1) for line in self.path.read_text().splitlines() if line]
        latencies = sorted(float(x[0]) for x in lines)
        failures = [x[1] for x in lines if len(x) > 1 and x[1].strip()]
        rss_after = self.proc.memory_info().rss
        cpu = sum(self.proc.cpu_times()[:2]) - self.cpu_before
        wall = time.monotonic() - self.began
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else float("nan")
        mib = 1 << 20
        print(f"{name:7} /healthz {len(latencies) - len(failures)}/{len(latencies)} answered, "
              f"max {max(latencies, default=float('nan')):.3f} s, p99 {p99:.3f} s, "
              f"median {statistics.median(latencies) if latencies else float('nan'):.3f} s; "
              f"RSS {self.rss_before / mib:.0f} -> peak {self.rss_peak / mib:.0f} -> {rss_after / mib:.0f} MiB; "
              f"CPU {cpu:.1f} s in {wall:.0f} s; load average {os.getloadavg()[0]:.1f}; {outcome}",
              flush=True)  # fmt: skip
        for failure in sorted(set(failures))[:3]:
            print(f"        probe failure: {failure}")


async def raw_exchange(port: int, head: bytes, *, drip: bool, seconds: float) -> bytes:
    """Send ``head`` then (``drip``) a body byte a second for ``seconds``; what the server
    answered (a plain socket: the kernel hands over what arrived before a reset)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    answer = bytearray()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        await loop.sock_sendall(sock, head)

        async def read() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while chunk := await loop.sock_recv(sock, 65536):
                    answer.extend(chunk)

        task = asyncio.ensure_future(read())
        deadline = time.monotonic() + seconds
        with contextlib.suppress(ConnectionError, OSError):
            while drip and not task.done() and time.monotonic() < deadline:
                await loop.sock_sendall(sock, b"x")
                await asyncio.wait({task}, timeout=1.0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, max(0.1, deadline - time.monotonic()))
    except OSError:
        pass
    finally:
        sock.close()
    return bytes(answer)


# --- the attacks ----------------------------------------------------------------------


async def drip(port: int, seconds: float) -> str:
    anonymous = (b"POST /v1/realtime/calls HTTP/1.1\r\nHost: x\r\nContent-Type: application/sdp\r\n"
                 b"Content-Length: 100000\r\n\r\n")  # fmt: skip
    keyed = (f"POST /v1/realtime/client_secrets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TENANT}\r\n"
             "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n").encode()  # fmt: skip
    tasks = []
    for _ in range(16):  # 512 without a credential, 32 every 100 ms (a burst past max_pending_connections at
        # once is refused 503 at the accept, by design: here each waits for its answer), then 64 with a key
        tasks += [asyncio.ensure_future(raw_exchange(port, anonymous, drip=True, seconds=seconds)) for _ in range(32)]
        await asyncio.sleep(0.1)
    tasks += [asyncio.ensure_future(raw_exchange(port, keyed, drip=True, seconds=seconds)) for _ in range(64)]
    answers = await asyncio.gather(*tasks)
    statuses: dict[str, int] = {}
    for answer in answers:
        status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/1.1 ") else "none"
        statuses[status] = statuses.get(status, 0) + 1
    return "answers by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))


class Silent:
    """Takes connections and never answers (TLS handshakes included): MCP listings hang."""

    def __init__(self) -> None:
        self.open = self.most = self.accepted = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.accepted += 1
        self.most = max(self.most, self.open)
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.open -= 1
        writer.close()


async def realtime_socket(port: int, key: str) -> Any:
    import websockets

    return await websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None,
                                    additional_headers={"Authorization": f"Bearer {key}"})  # fmt: skip


async def mcp(port: int, seconds: float, silent: Silent, silent_port: int) -> str:
    ws = await realtime_socket(port, TENANT)
    for update in range(6):
        tools = [{"type": "mcp", "server_label": f"s{update}_{i}", "require_approval": "never",
                  "server_url": f"{'https' if i % 2 else 'http'}://127.0.0.1:{silent_port}/mcp{update}/{i}"}
                 for i in range(128)]  # fmt: skip
        update = {"type": "session.update", "session": {"type": "realtime", "tools": tools}}
        await ws.send(orjson.dumps(update).decode())
    await asyncio.sleep(seconds)
    await ws.close()
    return f"listings holding a connection at once: at most {silent.most}; connections made: {silent.accepted}"


def png_bomb(width: int = 5000, height: int = 5000) -> bytes:
    """A valid 1-bit grayscale PNG of ``width`` x ``height``, all black: about 3 KB, and
    ``width * height * 3`` bytes once decoded to RGB (what a vision engine decodes)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    row = b"\x00" + bytes((width + 7) // 8)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height, 9))
        + chunk(b"IEND", b"")
    )


class DecodingEngine:
    """The passthrough engine, taking images and decoding every one a response gets (in a
    worker thread, one after another, as the ``vllm`` engine does), so RSS shows what a
    vision engine's decoding costs; made by ``images`` in this process."""

    @staticmethod
    def make() -> Any:
        import dataclasses

        from orchestrator.engines.images import conversation_images, decode_image
        from orchestrator.engines.passthrough import PassthroughEngine

        class Decoding(PassthroughEngine):
            def __init__(self) -> None:
                super().__init__(paced=False)
                self.info = dataclasses.replace(self.info, accepts_images=True)
                self.decoded = 0

            def respond(self, request: Any, inputs: Any) -> Any:
                images = conversation_images(request.messages)
                parent = super().respond

                async def run() -> Any:
                    decoded = await asyncio.to_thread(lambda: [decode_image(image) for image in images])
                    self.decoded += len(decoded)
                    del decoded
                    async for out in parent(request, inputs):
                        yield out

                return run()

        return Decoding()


async def images(run: Path) -> None:
    """960 items of a 3 KB PNG declaring 5000x5000 in one conversation, then a response,
    against a gateway in this process (its engine decodes what it is given)."""
    import websockets
    from support.gateway import run_gateway

    from gateway.settings import Settings

    data = png_bomb()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    engine = DecodingEngine.make()
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,))
    async with run_gateway(settings, engine=engine, vad_factory=None) as gw:
        with Watch(gw.port, os.getpid(), run, "images") as watch:
            ws = await websockets.connect(gw.url, max_size=None, additional_headers={"Authorization": f"Bearer {KEY}"})
            counts = {"added": 0, "deleted": 0, "error": 0, "done": 0}
            answered = asyncio.Event()

            async def read() -> None:
                with contextlib.suppress(Exception):
                    async for message in ws:
                        kind = orjson.loads(message)["type"]
                        key = {"conversation.item.added": "added", "conversation.item.deleted": "deleted",
                               "error": "error", "response.done": "done"}.get(kind)  # fmt: skip
                        if key:
                            counts[key] += 1
                        if kind == "response.done":
                            answered.set()

            reader = asyncio.ensure_future(read())
            item = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}
            for _ in range(960):
                await ws.send(orjson.dumps({"type": "conversation.item.create", "item": item}).decode())
            await ws.send(orjson.dumps({"type": "response.create"}).decode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(answered.wait(), 120)
            await ws.close()
            reader.cancel()
        kept = counts["added"] - counts["deleted"]
        watch.report("images", f"a {len(data)}-byte PNG declaring 5000x5000, 960 times: {counts['added']} added, "
                     f"{counts['deleted']} deleted, {kept} kept; the response's engine decoded {engine.decoded} "
                     f"({engine.decoded * 75} MB as RGB); RSS is this process's (gateway and client)")  # fmt: skip


async def video(port: int, seconds: float) -> str:
    import httpx
    import websockets

    ws = await websockets.connect(f"ws://127.0.0.1:{port}/v1/realtime/video", max_size=None,
                                  additional_headers={"Authorization": f"Bearer {KEY}"})  # fmt: skip
    await ws.send(orjson.dumps({"type": "session.start", "prompt": "a quiet lake", "width": 64, "height": 48,
                                "fps": 8, "frames_per_chunk": 4, "format": "jpeg"}).decode())  # fmt: skip
    sid = None
    while sid is None:
        message = await ws.recv()
        if isinstance(message, str):
            event = orjson.loads(message)
            sid = event.get("session_id") if event.get("type") == "video.start" else None
            if event.get("type") == "error":
                return f"the stream did not start: {event}"

    async def drain() -> None:
        with contextlib.suppress(Exception):
            async for _ in ws:
                pass

    drainer = asyncio.ensure_future(drain())
    statuses: dict[int, int] = {}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        url = f"/v1/realtime/video/{sid}/interactions"
        for i in range(400):
            event_id = ("x" * (900 << 10) + str(i)) if i < 200 else f"{i:0256d}"  # (900 KiB: under the body cap)
            r = await http.post(url, headers={"Authorization": f"Bearer {KEY}"},
                                json={"interaction": {"event_id": event_id, "event": {"prompt": f"p{i}"}}})  # fmt: skip
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    await asyncio.sleep(seconds)
    drainer.cancel()
    await ws.close()
    return "interactions by status: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items()))


async def relay(run: Path, seconds: float) -> None:
    """Two replicas, a call on A, its sideband on B flooding (see the module docstring)."""
    import httpx
    import redis
    import websockets
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
    from support.redis_server import RedisServer

    with RedisServer() as server:
        client = redis.Redis(port=server.port)
        client.config_set("client-output-buffer-limit", "pubsub 1mb 256kb 5")
        env = {"OMNI_GATEWAY_REDIS_URL": server.url, "OMNI_GATEWAY_VIDEO_ENGINE": "none",
               "OMNI_GATEWAY_WEBRTC_PEER_NETWORKS": "127.0.0.0/8",
               "OMNI_GATEWAY_WEBRTC_ADVERTISED_ADDRESSES": "127.0.0.1", "OMNI_GATEWAY_WEBRTC_ADVERTISE_MODE": "replace",
               "OMNI_GATEWAY_MAX_CONVERSATION_BYTES": str(64 << 20)}  # fmt: skip
        a_port, b_port = free_port(), free_port()
        a = start_gateway(a_port, run / "relay-a.log", {**env, "OMNI_GATEWAY_REPLICA_ID": "ra"})
        b = start_gateway(b_port, run / "relay-b.log", {**env, "OMNI_GATEWAY_REPLICA_ID": "rb"})
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        try:
            pc.createDataChannel("oai-events")
            pc.addTransceiver("audio", direction="sendrecv")
            await pc.setLocalDescription(await pc.createOffer())
            headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/sdp"}
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(f"http://127.0.0.1:{a_port}/v1/realtime/calls", content=pc.localDescription.sdp,
                                    headers=headers)  # fmt: skip
            r.raise_for_status()
            await pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
            call_id = r.headers["location"].rsplit("/", 1)[1]
            with Watch(a_port, a.pid, run, "relay") as watch:
                side = await websockets.connect(
                    f"ws://127.0.0.1:{b_port}/v1/realtime?call_id={call_id}",
                    max_size=None,
                    additional_headers={"Authorization": f"Bearer {KEY}"},
                )
                refused = {"n": 0, "added": 0}

                async def read() -> None:
                    with contextlib.suppress(Exception):
                        async for message in side:
                            kind = orjson.loads(message)["type"]
                            refused["n"] += kind == "error"
                            refused["added"] += kind == "conversation.item.added"

                reader = asyncio.ensure_future(read())
                deadline = time.monotonic() + seconds
                sent = 0
                closed = "still open"
                try:
                    while time.monotonic() < deadline:
                        size = (3 << 19) if sent % 10 == 0 else 60_000
                        text = "z" * size
                        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
                        await side.send(orjson.dumps({"type": "conversation.item.create", "item": item}).decode())
                        sent += 1
                except websockets.ConnectionClosed as exc:
                    # (what the call's replica holds for it past outbound_queue_bytes: closed 4010)
                    code = exc.rcvd.code if exc.rcvd is not None else None
                    closed = f"closed by the gateway ({code}) after {time.monotonic() - deadline + seconds:.0f} s"
                await asyncio.sleep(2)
                await side.close()
                reader.cancel()
            cut = server.log().count("for overcoming of output buffer limits")  # (Redis 7.0 counts none)
            watch.report("relay", f"{sent} messages sent through B ({refused['n']} refused there, "
                         f"{refused['added']} items relayed back; the sideband {closed}); subscriptions Redis cut "
                         f"for their output buffer: {cut}")  # fmt: skip
        finally:
            await pc.close()
            for proc in (a, b):
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
            client.close()


# ---


async def run_one(name: str, run: Path, seconds: float, body: Callable[[int], Awaitable[str]],
                  env: dict[str, str] | None = None) -> None:  # fmt: skip
    port = free_port()
    proc = start_gateway(port, run / f"{name}.log", env)
    try:
        with Watch(port, proc.pid, run, name) as watch:
            outcome = await body(port)
            await asyncio.sleep(1)
        watch.report(name, outcome)
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[tuple[Silent, int]]:
    silent = Silent()
    server = await asyncio.start_server(silent.serve, "127.0.0.1", 0)
    try:
        yield silent, server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def main_async(args: argparse.Namespace) -> None:
    run = Path(tempfile.mkdtemp(prefix="bench-attacks-"))
    print(f"run directory: {run}", flush=True)
    only = set(args.only or ["drip", "mcp", "images", "video", "relay"])
    if "drip" in only:  # (35 s: past request_timeout_s, so the keyed drips get their 408)
        await run_one("drip", run, 35.0, lambda port: drip(port, 35.0))
    if "mcp" in only:
        async with silent_server() as (silent, silent_port):
            env = {"OMNI_GATEWAY_MCP_ALLOWED_URLS": f"http://127.0.0.1:{silent_port}/,https://127.0.0.1:{silent_port}/",
                   "OMNI_GATEWAY_MCP_TIMEOUT_S": "10"}  # fmt: skip
            await run_one("mcp", run, args.seconds, lambda port: mcp(port, args.seconds, silent, silent_port), env)
    if "images" in only:
        await images(run)
    if "video" in only:
        await run_one("video", run, 2.0, lambda port: video(port, 2.0))
    if "relay" in only:
        await relay(run, args.seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=["drip", "mcp", "images", "video", "relay"])
    parser.add_argument("--seconds", type=float, default=15.0, help="how long the MCP and relay attacks last")
    asyncio.run(main_async(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
