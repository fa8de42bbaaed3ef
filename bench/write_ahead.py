"""What write-ahead costs: store round trips per answer, and what the client waits.

One gateway process on a private ``redis-server`` (127.0.0.1), one client, ``--turns``
text turns back to back: ``conversation.item.create`` then ``response.create``, read
until ``rate_limits.updated``. Per turn it counts the gateway's Redis round trips
(``RedisStore.round_trips``: every journal commit, lease call and trim is one) and
times, on the client, item.create -> ``conversation.item.added``, response.create ->
``response.created``, and the last delta -> ``response.done`` (each of these waits for
one commit under write-ahead; the passthrough's last figure also holds its pacing,
20 ms after the last chunk). A Redis ``PING`` from the client is timed too: the
floor of one round trip.

Engines: ``passthrough`` (a 1 s spoken answer: 50 paced chunks of 20 ms, a word and
an audio delta each) and ``cascade`` (eSpeak speaks the echo, unpaced).

    python bench/write_ahead.py                 # ~1 min
    python bench/write_ahead.py --turns 50 --engine passthrough

To compare with a tree without write-ahead, run this file with ``PYTHONPATH`` set to
that tree (it uses only ``tests/support`` and public APIs).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from support.gateway import Client, connect, run_gateway  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402

from gateway.settings import Settings  # noqa: E402

DELTAS = ("response.output_audio.delta", "response.output_audio_transcript.delta", "response.output_text.delta")


def build_engine(name: str) -> Any:
    if name == "passthrough":
        from orchestrator.engines.passthrough import PassthroughEngine

        return PassthroughEngine()
    from orchestrator.engines.cascade import CascadeEngine

    return CascadeEngine()


async def turn(c: Client, text: str) -> dict[str, float]:
    t: dict[str, float] = {}
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    t["sent_item"] = time.perf_counter()
    await c.send({"type": "conversation.item.create", "item": item})
    await c.wait_for("conversation.item.added")
    t["item_added"] = time.perf_counter()
    await c.wait_for("conversation.item.done")
    t["sent_response"] = time.perf_counter()
    await c.send({"type": "response.create"})
    await c.wait_for("response.created")
    t["created"] = time.perf_counter()
    while True:
        event = await c.recv(30)
        if event["type"] in DELTAS:
            t["last_delta"] = time.perf_counter()
        elif event["type"] == "response.done":
            t["done"] = time.perf_counter()
        elif event["type"] == "rate_limits.updated":
            return t


def ms(values: list[float]) -> str:
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
    return f"p50 {statistics.median(values) * 1000:6.2f} ms, p95 {p95 * 1000:6.2f} ms"


async def run(engine_name: str, turns: int) -> None:
    with RedisServer() as server:
        settings = Settings(engine=engine_name, redis_url=server.url, video_engine="none")
        async with run_gateway(settings, engine=build_engine(engine_name), vad_factory=None) as gw:
            store: Any = gw.runtime.store
            probe = aioredis.from_url(server.url)
            pings = []
            for _ in range(50):
                started = time.perf_counter()
                await probe.ping()
                pings.append(time.perf_counter() - started)
            await probe.aclose()
            async with connect(gw.url) as c:
                await c.wait_for("session.created")
                await c.send({"type": "session.update", "session": {"type": "realtime",
                              "audio": {"input": {"turn_detection": None}}}})  # fmt: skip
                await c.wait_for("session.updated")
                await turn(c, "warm up")
                rows, trips, events = [], [], []
                for i in range(turns):
                    await asyncio.sleep(0.1)  # the previous turn's commits are done
                    before, seen = store.round_trips, len(c.events)
                    rows.append(await turn(c, f"hello number {i}"))
                    await asyncio.sleep(0.1)
                    trips.append(store.round_trips - before)
                    events.append(len(c.events) - seen)
    print(f"engine {engine_name}: {turns} turns of {statistics.median(events):.0f} events each")
    print(f"  Redis round trips per turn (item + answer): median {statistics.median(trips):.0f}, "
          f"max {max(trips)}")  # fmt: skip
    print(f"  Redis PING from the client:           {ms(pings)}")
    print(f"  item.create -> item.added:            {ms([r['item_added'] - r['sent_item'] for r in rows])}")
    print(f"  response.create -> response.created:  {ms([r['created'] - r['sent_response'] for r in rows])}")
    print(f"  last delta -> response.done:          {ms([r['done'] - r['last_delta'] for r in rows])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--engine", choices=("passthrough", "cascade", "both"), default="both")
    args = parser.parse_args()
    for name in ("passthrough", "cascade") if args.engine == "both" else (args.engine,):
        asyncio.run(run(name, args.turns))


if __name__ == "__main__":
    main()
