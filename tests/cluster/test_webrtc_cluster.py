"""WebRTC calls across replicas: redis + 3 gateway replicas + nginx, real processes, and an
aiortc browser in the test process (its media goes to whichever replica answered).

- A call's replica drains (SIGTERM) or dies (SIGKILL): the browser re-offers, carrying
  its session's resume token, to another replica; the conversation, the answer under way
  and the data channel's events carry on from the journal, no event lost or repeated on
  the channel (what a crash lost from the journal is said, never silently skipped). The
  gap a listener hears is measured and printed.
- A sideband socket on a replica that does not serve the call holds its session through
  the bus; a hangup sent to any replica ends the call.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import websockets

if os.environ.get("CI"):
    import aiortc  # noqa: F401  (CI installs the webrtc extra: a missing one fails, never skips)
else:
    pytest.importorskip("aiortc")

from aiortc import RTCSessionDescription
from conftest import Harness
from webrtc.rtc_support import Browser, make_browser, rms, wait_for

from gateway.store.redis import RedisStore

pytestmark = pytest.mark.timeout(180)

TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}


@dataclass
class Call:
    """One of the browser's calls (a re-offer makes a new one), and what its channel read."""

    browser: Browser
    call_id: str
    events: list[dict[str, Any]] = field(default_factory=list)
    loud_at: list[float] = field(default_factory=list)  # monotonic times of answer audio frames

    def send(self, event: dict[str, Any]) -> None:
        assert self.browser.channel is not None
        self.browser.channel.send(orjson.dumps(event).decode())

    async def wait_for(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        await wait_for(lambda: any(e["type"] == kind for e in self.events), kind, timeout)
        return next(e for e in self.events if e["type"] == kind)

    @property
    def closed(self) -> bool:
        return self.browser.pc.connectionState in ("closed", "failed") or (
            self.browser.channel is not None and self.browser.channel.readyState == "closed"
        )


async def offer(base: str, key: str, resume: dict[str, Any] | None = None) -> Call:
    browser, sdp = await make_browser()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/sdp"}
    if resume is not None:
        headers["X-Omni-Resume"] = orjson.dumps(resume).decode()
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{base}/v1/realtime/calls", content=sdp, headers=headers)
    if r.status_code != 201:
        await browser.close()
        raise AssertionError(f"{r.status_code}: {r.text}")
    c = Call(browser, r.headers["location"].rsplit("/", 1)[1])
    assert browser.channel is not None
    browser.channel.on("message", lambda m: c.events.append(orjson.loads(m)))
    await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
    return c


async def token_of(c: Call) -> str:
    first = await c.wait_for("session.resumed" if any(e["type"] == "session.resumed" for e in c.events)
                             else "session.created")  # fmt: skip
    return str(first["resume_token"])


@pytest.fixture
async def journal(harness: Harness) -> AsyncIterator[RedisStore]:
    store = RedisStore(harness.cluster.redis_url)
    yield store
    await store.close()


async def hand_over(harness: Harness, journal: RedisStore, how: int) -> None:
    """A call on replica 0 with an answer under way; replica 0 drains or dies; the browser
    re-offers through nginx (any replica but the gone one answers)."""
    key = harness.api_key
    first = await offer(harness.cluster.replicas[0].http, key)
    second: Call | None = None
    try:
        created = await first.wait_for("session.created")
        sid = created["session"]["id"]
        first.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
            "turn_detection": None}}}})  # fmt: skip
        first.send({"type": "conversation.item.create", "item": TEXT})
        first.send({"type": "response.create"})
        await wait_for(lambda: len(first.browser.received.loud()) >= 10, "the answer's audio on the first call")
        if how == signal.SIGKILL:
            await harness.wait_journaled(sid, first.events[-1]["server_event_seq"])
        harness.cluster.kill_replica(0, how)
        if how == signal.SIGTERM:
            await wait_for(lambda: first.closed, "the drained replica to end the call", 30)
        await harness.cluster.await_exit(0)
        # The browser gives the old call up before it re-offers (as the SDK does): what it
        # read by then is what it holds.
        await first.browser.close()
        heard_last = max(t for t, _, x in first.browser.received.frames if rms(x) > 200)
        last = max(e["server_event_seq"] for e in first.events)
        resume = {"session_id": sid, "resume_token": await token_of(first), "last_received_server_event_seq": last}
        second = await offer(harness.cluster.http, key, resume)
        said = await wait_for_any(second, ("session.resumed", "session.resync_required"))
        # Recovered: the answer that died with the replica (or was cut by the drain) ends
        # explicitly, and the conversation goes on with a new answer on the new call.
        second.send({"type": "response.create"})
        await wait_for(lambda: sum(e["type"] == "response.done" for e in second.events) >= 1, "an answer", 60)
        await wait_for(lambda: len(second.browser.received.loud()) >= 10, "the answer's audio on the new call")
        heard_again = min(t for t, _, x in second.browser.received.frames if rms(x) > 200)
        print(
            f"\n{signal.Signals(how).name}: listener's gap {1000 * (heard_again - heard_last):.0f} ms "
            f"(last answer audio on the old call -> first on the new one); replica 0 -> {second.call_id}"
        )
        assert second.call_id == first.call_id  # a call keeps its id across replicas
        seen = [e["server_event_seq"] for e in first.events + second.events if e["server_event_seq"]]
        repeated = sorted({s for s in seen if seen.count(s) > 1})
        assert not repeated, (
            "an event repeated on the data channel",
            [
                (which, e["type"], e["server_event_seq"])
                for which, c in (("old", first), ("new", second))
                for e in c.events
                if e["server_event_seq"] in repeated or e["type"].startswith("session.")
            ],
        )
        assert seen == sorted(seen)
        if said["type"] == "session.resumed":
            # Nothing lost: every journaled event the channel carries (all but the answers'
            # audio, which is on the track) reached the browser across the two calls.
            upto = max(seen)
            await harness.wait_journaled(sid, upto)  # (the new replica journals its deltas in batches)
            read = await journal.read_events(sid, after_seq=0)
            expected = [s for s, data in read.events if b'"response.output_audio.delta"' not in data[:64]]
            assert [s for s in expected if s <= upto] == [s for s in seen if s >= expected[0]]
        else:
            assert how == signal.SIGKILL  # only a crash can leave the browser ahead of the store
    finally:
        await first.browser.close()
        if second is not None:
            await second.browser.close()
        await harness.ensure_all_up()


async def wait_for_any(c: Call, kinds: tuple[str, ...]) -> dict[str, Any]:
    await wait_for(lambda: any(e["type"] in kinds for e in c.events), " or ".join(kinds))
    return next(e for e in c.events if e["type"] in kinds)


async def test_a_call_whose_replica_drains_is_re_offered_elsewhere_and_carries_on(
    harness: Harness, journal: RedisStore
) -> None:
    await hand_over(harness, journal, signal.SIGTERM)


async def test_a_call_whose_replica_dies_is_re_offered_elsewhere_and_carries_on(
    harness: Harness, journal: RedisStore
) -> None:
    await hand_over(harness, journal, signal.SIGKILL)


@pytest.mark.parametrize("redis_topology", ["single", "cluster"], indirect=True)
async def test_a_sideband_on_another_replica_holds_the_call_and_a_hangup_anywhere_ends_it(harness: Harness) -> None:
    key = harness.api_key
    auth = {"Authorization": f"Bearer {key}"}
    c = await offer(harness.cluster.replicas[0].http, key)
    try:
        created = await c.wait_for("session.created")
        sid = created["session"]["id"]
        assert await harness.wait_owner(sid) == 0
        url = f"{harness.cluster.replicas[1].url}?call_id={c.call_id}"
        async with websockets.connect(url, additional_headers=auth) as side:  # relayed: replica 1 -> 0
            await side.send(orjson.dumps({"type": "session.update", "session": {"type": "realtime",
                            "instructions": "From the sideband."}}).decode())  # fmt: skip
            updated = await c.wait_for("session.updated")
            assert updated["session"]["instructions"] == "From the sideband."
            echoed = orjson.loads(await asyncio.wait_for(side.recv(), 10))
            assert (echoed["type"], echoed["server_event_seq"]) == ("session.updated", updated["server_event_seq"])
            # In order through the relay, however fast the backend writes.
            for i in range(30):
                item = {**TEXT, "id": f"item_side_{i:02d}"}
                await side.send(orjson.dumps({"type": "conversation.item.create", "item": item}).decode())
            await wait_for(lambda: sum(e["type"] == "conversation.item.done" for e in c.events) == 30, "30 items")
            done = [e["item"]["id"] for e in c.events if e["type"] == "conversation.item.done"]
            assert done == [f"item_side_{i:02d}" for i in range(30)]
            async with httpx.AsyncClient(timeout=10) as http:  # hung up through replica 2
                r = await http.post(f"{harness.cluster.replicas[2].http}/v1/realtime/calls/{c.call_id}/hangup",
                                    headers=auth)  # fmt: skip
                assert r.status_code == 200, r.text
            await wait_for(lambda: c.closed, "the call to end")
            with pytest.raises(websockets.ConnectionClosed):
                started = time.monotonic()
                while time.monotonic() - started < 30:
                    await asyncio.wait_for(side.recv(), 30)  # the sideband closes with its call's session
    finally:
        await c.browser.close()
