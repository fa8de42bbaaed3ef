"""What one resume costs, by conversation length, and a herd of resumes on one replica.

A local cluster (``deploy/local_cluster.py``: redis-server and ``--replicas`` passthrough
gateways; nginx is not used, each replica is reached on its own port). Raw WebSocket
clients (``websockets``, no SDK: nothing but the protocol is timed):

1. **Length.** For each of ``--items`` (default 1, 100, 1000): a session is opened on
   r0 and given that many conversation items (``conversation.item.create``, text), then
   its TCP connection is aborted (no close frame) and it is resumed ``--repeats`` times,
   each time on the replica that does not hold it (every resume is a takeover from the
   store, what a drain or a crash asks of a replica). Timed: socket open ->
   ``session.resumed`` (the provisional ``session.created`` and the ``session.resume``
   included), ``session.resume`` sent -> ``session.resumed`` (the claim alone; target:
   flat in conversation length), and ``session.resume`` sent -> the answer to a
   ``conversation.item.retrieve`` of the first item, sent right after ``session.resumed``:
   the replica reads the conversation once the resume is answered, and the client's
   next events wait for it, so this one grows with the conversation (what is left of it).
   In turn with those, the same resume on a resume-only socket (``?resume=1``, what the
   SDK reconnects with): socket open -> ``session.resumed`` with no provisional session.
2. **Herd.** ``--herd`` sessions (``--herd-items`` items each) are opened on r0 and all
   dropped; then all resume on r1 at once (each already connected and holding its
   provisional ``session.created``, so the figure is the replica's, not the handshakes'):
   the time from the ``session.resume`` being sent to each ``session.resumed``
   (target p99 <= 100 ms).

    python bench/resume_cost.py                     # ~30 s
    python bench/resume_cost.py --items 1 10 100 1000 --repeats 50 --herd 30
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.local_cluster import Cluster  # noqa: E402

API_KEY = "sk-bench-resume-cost"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@dataclass
class Held:
    """A session as its client knows it."""

    session_id: str
    token: str
    last: int


async def recv_until(ws: ClientConnection, kind: str) -> dict[str, Any]:
    """Read events until one of ``kind``; raise on an error event."""
    while True:
        event = orjson.loads(await ws.recv())
        if event["type"] == "error":
            raise RuntimeError(f"error while waiting for {kind}: {event['error']}")
        if event["type"] == kind:
            return event


def seq_of(event: dict[str, Any], last: int) -> int:
    seq = event.get("server_event_seq")
    return seq if isinstance(seq, int) and seq > last else last


async def open_session(url: str, items: int) -> tuple[ClientConnection, Held]:
    """A new session with ``items`` text items, its client holding every event's seq."""
    ws = await connect(url, additional_headers=HEADERS, max_size=None, compression=None)
    created = await recv_until(ws, "session.created")
    last = seq_of(created, 0)
    for n in range(items):
        item = {"id": f"item_{n}", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": f"message {n}"}]}  # fmt: skip
        await ws.send(orjson.dumps({"type": "conversation.item.create", "item": item}).decode())
    done = 0
    while done < items:
        event = orjson.loads(await ws.recv())
        last = seq_of(event, last)
        if event["type"] == "error":
            raise RuntimeError(f"item refused: {event['error']}")
        done += event["type"] == "conversation.item.done"
    return ws, Held(created["session"]["id"], created["resume_token"], last)


def drop(ws: ClientConnection) -> None:
    """The TCP connection aborted, no close frame: what a lost network or a crash looks like."""
    ws.transport.abort()


async def connect_provisional(url: str) -> ClientConnection:
    ws = await connect(url, additional_headers=HEADERS, max_size=None, compression=None)
    await recv_until(ws, "session.created")
    return ws


async def connect_resume_only(url: str) -> ClientConnection:
    """A socket with ``?resume=1``: no provisional session (what the SDK reconnects with)."""
    return await connect(url + "?resume=1", additional_headers=HEADERS, max_size=None, compression=None)


async def resume(ws: ClientConnection, held: Held, *, first_item: str | None = None) -> tuple[float, float]:
    """Send ``session.resume`` on a connected socket: seconds until ``session.resumed``, and
    until ``first_item`` (retrieved right after it; 0.0 when None) came back."""
    request = {"type": "session.resume", "session_id": held.session_id, "resume_token": held.token,
               "last_received_server_event_seq": held.last}  # fmt: skip
    began = time.perf_counter()
    await ws.send(orjson.dumps(request).decode())
    resumed = await recv_until(ws, "session.resumed")
    took = time.perf_counter() - began
    held.token = resumed["resume_token"]
    held.last = max(held.last, resumed["replay_to"])
    if first_item is None:
        return took, 0.0
    await ws.send(orjson.dumps({"type": "conversation.item.retrieve", "item_id": first_item}).decode())
    await recv_until(ws, "conversation.item.retrieved")
    return took, time.perf_counter() - began


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Row = tuple[int, list[float], list[float], list[float], list[float]]


async def by_length(cluster: Cluster, counts: list[int], repeats: int) -> list[Row]:
    urls = [r.url for r in cluster.replicas]
    rows = []
    for items in counts:
        ws, held = await open_session(urls[0], items)
        drop(ws)
        whole, claim, loaded, resume_only = [], [], [], []
        for n in range(2 * repeats):  # a socket that opens a session, then a resume-only one, in turn
            began = time.perf_counter()
            url = urls[(n + 1) % 2]  # always the replica that does not hold it
            ws = await (connect_provisional(url) if n % 2 == 0 else connect_resume_only(url))
            opened = time.perf_counter() - began
            answered, retrieved = await resume(ws, held, first_item="item_0")
            if n % 2:
                resume_only.append(opened + answered)
            else:
                whole.append(opened + answered)
                claim.append(answered)
                loaded.append(retrieved)
            drop(ws)
        rows.append((items, whole, claim, loaded, resume_only))
    return rows


async def herd(cluster: Cluster, sessions: int, items: int) -> list[float]:
    urls = [r.url for r in cluster.replicas]
    opened = await asyncio.gather(*(open_session(urls[0], items) for _ in range(sessions)))
    for ws, _ in opened:
        drop(ws)
    sockets = await asyncio.gather(*(connect_provisional(urls[1]) for _ in range(sessions)))
    took = await asyncio.gather(*(resume(ws, held) for ws, (_, held) in zip(sockets, opened, strict=True)))
    for ws in sockets:
        drop(ws)
    return [answered for answered, _ in took]


async def main(args: argparse.Namespace) -> int:
    env = {"OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_DETACH_GRACE_S": "30"}
    async with Cluster(replicas=2, engine="passthrough", api_keys=(API_KEY,), env=env) as cluster:
        rows = await by_length(cluster, args.items, args.repeats)
        print(f"resume by conversation length ({args.repeats} resumes each, every one a takeover from Redis):")
        print(f"  {'items':>6}  {'open->resumed':>13} {'p99':>7}  {'resume->resumed':>15} {'p99':>7}"
              f"  {'resume->first item':>18} {'p99':>7}  {'?resume=1 open->resumed':>23} {'p99':>7}")  # fmt: skip
        for items, whole, claim, loaded, resume_only in rows:
            print(f"  {items:>6}  {ms(whole, 0.5):>11.1f}ms {ms(whole, 0.99):>5.1f}ms"
                  f"  {ms(claim, 0.5):>13.1f}ms {ms(claim, 0.99):>5.1f}ms"
                  f"  {ms(loaded, 0.5):>16.1f}ms {ms(loaded, 0.99):>5.1f}ms"
                  f"  {ms(resume_only, 0.5):>21.1f}ms {ms(resume_only, 0.99):>5.1f}ms")  # fmt: skip
        first, last = statistics.median(rows[0][2]), statistics.median(rows[-1][2])
        print(f"  resume->resumed median, {rows[-1][0]} items / {rows[0][0]}: {last / first:.2f}x")
        took = await herd(cluster, args.herd, args.herd_items)
        print(f"herd: {args.herd} resumes at once on one replica ({args.herd_items} items each): "
              f"p50 {ms(took, 0.5):.1f} ms, p99 {ms(took, 0.99):.1f} ms, max {1000 * max(took):.1f} ms")  # fmt: skip
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--items", type=int, nargs="+", default=[1, 100, 1000], help="conversation lengths")
    p.add_argument("--repeats", type=int, default=30, help="resumes per length")
    p.add_argument("--herd", type=int, default=30, help="sessions resuming at once on one replica")
    p.add_argument("--herd-items", type=int, default=20, help="items in each herd session")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
