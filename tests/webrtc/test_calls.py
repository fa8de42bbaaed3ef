"""WebRTC calls end to end (``POST /v1/realtime/calls``), an aiortc "browser" against the
gateway on this machine: both request forms, client secrets, the answer's audio as a
track paced and cut by the gateway, the WebRTC-only events, the sideband socket, hangup,
and every refusal before any media (docs/webrtc.md).

The engine is the passthrough one (a paced tone, a word per 20 ms chunk): what is under
test is the transport, not a model. Every event read off the data channel is checked
against the official SDK's models, as a WebSocket client's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import websockets
from aiortc import RTCSessionDescription
from rtc_support import Browser, make_browser, wait_for
from support.gateway import RunningGateway, run_gateway
from support.sdk_shapes import check_event

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(120)

KEY = "sk-webrtc-test"
OTHER = "sk-webrtc-other"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}


@dataclass
class Caller:
    """A browser holding a call: its aiortc side and what its data channel received."""

    browser: Browser
    call_id: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def send(self, event: dict[str, Any]) -> None:
        assert self.browser.channel is not None
        self.browser.channel.send(orjson.dumps(event).decode())

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def wait_for(self, kind: str, after: int = 0, **fields: Any) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in self.events[after:] if e["type"] == kind
                         and all(e.get(k) == v for k, v in fields.items())), None)  # fmt: skip

        await wait_for(lambda: found() is not None, kind)
        event = found()
        assert event is not None
        return event

    def loud_frames(self) -> int:
        return len(self.browser.received.loud())


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY, OTHER), detach_grace_s=2.0)
    engine = PassthroughEngine(audio_chunks=150, paced=True)  # a 3 s answer
    async with run_gateway(settings, engine=engine, vad_factory=False) as gw:
        yield gw


async def post_offer(gw: RunningGateway, offer: str, headers: dict[str, str], **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as http:
        return await http.post(f"{gw.http}/v1/realtime/calls", content=offer,
                               headers={"Content-Type": "application/sdp", **headers}, **kwargs)  # fmt: skip


@contextlib.asynccontextmanager
async def call(gw: RunningGateway, headers: dict[str, str] | None = None, **post: Any) -> AsyncIterator[Caller]:
    browser, offer = await make_browser()
    try:
        if "files" in post:
            async with httpx.AsyncClient(timeout=30) as http:
                r = await http.post(f"{gw.http}/v1/realtime/calls", headers=headers or AUTH,
                                    files={"sdp": (None, offer, "application/sdp"), **post["files"]})  # fmt: skip
        else:
            r = await post_offer(gw, offer, headers or AUTH)
        assert r.status_code == 201, r.text
        assert r.headers["content-type"].startswith("application/sdp")
        location = r.headers["location"]
        assert location.startswith("/v1/realtime/calls/rtc_")
        caller = Caller(browser, location.rsplit("/", 1)[1])
        assert browser.channel is not None

        resumes = "X-Omni-Resume" in (headers or {})  # it speaks the gateway's extensions (session.resumed)

        def received(message: str) -> None:
            event = orjson.loads(message)
            check_event(event, extensions=resumes)  # exactly the WebSocket dialect's events, as the SDK models them
            caller.events.append(event)

        browser.channel.on("message", received)
        await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
        await caller.wait_for("session.resumed" if resumes else "session.created")
        yield caller
    finally:
        await browser.close()


async def test_a_browser_offer_with_a_client_secret_holds_the_secrets_session(gw: RunningGateway) -> None:
    async with httpx.AsyncClient() as http:
        minted = (await http.post(f"{gw.http}/v1/realtime/client_secrets", headers=AUTH, json={"session": {
            "type": "realtime", "instructions": "Answer briefly.", "audio": {"input": {"turn_detection": None}},
        }})).json()  # fmt: skip
    assert minted["value"].startswith("ek_") and minted["ice_servers"] == []
    async with call(gw, {"Authorization": f"Bearer {minted['value']}"}) as c:
        session = c.events[0]["session"]
        assert session["instructions"] == "Answer briefly."
        assert c.call_id == "rtc_" + session["id"].removeprefix("sess_")
        c.send({"type": "conversation.item.create", "item": TEXT})
        c.send({"type": "response.create"})
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "completed"
        await c.wait_for("output_audio_buffer.stopped", response_id=done["response"]["id"])
        kinds = c.types()
        # The answer's audio is on the track, never on the channel; its transcript is on the channel.
        assert "response.output_audio.delta" not in kinds and "response.output_audio_transcript.delta" in kinds
        assert kinds.index("output_audio_buffer.started") < kinds.index("response.done")
        assert c.loud_frames() >= 140  # 150 chunks of 20 ms: all but the edges of the tone
        seqs = [e["server_event_seq"] for e in c.events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    async with httpx.AsyncClient() as http:  # a client secret opens one call
        browser, offer = await make_browser()
        r = await post_offer(gw, offer, {"Authorization": f"Bearer {minted['value']}"})
        await browser.close()
    assert r.status_code == 401 and r.json()["error"]["code"] == Code.UNAUTHORIZED


async def test_a_client_secrets_call_opens_its_minted_model_and_no_other(gw: RunningGateway) -> None:
    async with httpx.AsyncClient() as http:
        minted = (await http.post(f"{gw.http}/v1/realtime/client_secrets", headers=AUTH, json={"session": {
            "type": "realtime", "instructions": "Minted.", "audio": {"input": {"turn_detection": None}},
        }})).json()  # fmt: skip
        browser, offer = await make_browser()
        try:
            other = orjson.dumps({"type": "realtime", "model": "another-model"})
            r = await http.post(f"{gw.http}/v1/realtime/calls", headers={"Authorization": f"Bearer {minted['value']}"},
                                files={"sdp": (None, offer, "application/sdp"),
                                       "session": (None, other, "application/json")})  # fmt: skip
        finally:
            await browser.close()
    assert r.status_code == 403, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (Code.MODEL_NOT_ALLOWED, "session.model")
    assert minted["session"]["model"] in r.json()["error"]["message"]


async def test_the_unified_form_sends_the_session_with_the_offer(gw: RunningGateway) -> None:
    session = {"type": "realtime", "instructions": "From the backend.", "output_modalities": ["audio"]}
    async with call(gw, files={"session": (None, orjson.dumps(session), "application/json")}) as c:
        assert c.events[0]["session"]["instructions"] == "From the backend."


async def test_a_cancel_cuts_the_audio_within_a_frame_and_truncates_at_what_was_sent(gw: RunningGateway) -> None:
    async with call(gw) as c:
        c.send(
            {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
        )
        c.send({"type": "conversation.item.create", "item": TEXT})
        c.send({"type": "response.create"})
        await wait_for(lambda: c.loud_frames() >= 25, "half a second of the answer")
        (live,) = gw.runtime.calls.calls.values()  # type: ignore[union-attr]
        c.send({"type": "response.cancel"})  # as the Agents SDK interrupts: cancel, then clear
        c.send({"type": "output_audio_buffer.clear"})
        done = await c.wait_for("response.done")
        assert done["response"]["status"] == "cancelled"
        cut_at = live.track.audio_frames_sent
        truncated = await c.wait_for("conversation.item.truncated")
        cleared = await c.wait_for("output_audio_buffer.cleared")
        assert cleared["response_id"] == done["response"]["id"]
        item_id = done["response"]["output"][0]["id"]
        assert truncated["item_id"] == item_id and truncated["content_index"] == 0
        sent = live.track.sent_ms(item_id)
        assert truncated["audio_end_ms"] == sent  # the item keeps exactly what went out
        await asyncio.sleep(0.3)  # 15 frame periods: the track would have sent them by now
        assert live.track.audio_frames_sent - cut_at <= 1  # at most the frame already composed
        assert 500 <= sent < 3000
        retrieved = c.types().count("conversation.item.truncated")
        assert retrieved == 1 and "output_audio_buffer.stopped" not in c.types()  # cut, not drained


async def test_a_sideband_socket_holds_the_calls_session_beside_the_browser(gw: RunningGateway) -> None:
    async with call(gw) as c:
        url = f"{gw.url}?call_id={c.call_id}"
        async with websockets.connect(url, additional_headers=AUTH) as side:
            await side.send(orjson.dumps({"type": "session.update", "session": {"type": "realtime",
                            "instructions": "Set by the backend."}}).decode())  # fmt: skip
            updated = await c.wait_for("session.updated")  # the browser sees the backend's update
            assert updated["session"]["instructions"] == "Set by the backend."
            seen = orjson.loads(await asyncio.wait_for(side.recv(), 10))
            assert seen["type"] == "session.updated" and seen["server_event_seq"] == updated["server_event_seq"]
            await side.send(orjson.dumps({"type": "conversation.item.create", "item": TEXT}).decode())
            await side.send(orjson.dumps({"type": "response.create"}).decode())
            done = await c.wait_for("response.done")
            assert done["response"]["status"] == "completed" and c.loud_frames() > 100  # it played on the call
            side_types = []
            while "response.done" not in side_types:
                side_types.append(orjson.loads(await asyncio.wait_for(side.recv(), 10))["type"])
        # The sideband went; the call goes on.
        c.send({"type": "response.create"})
        await c.wait_for("response.done", after=c.events.index(done) + 1)


async def test_another_principal_cannot_reach_a_call(gw: RunningGateway) -> None:
    other = {"Authorization": f"Bearer {OTHER}"}
    async with call(gw) as c:
        async with websockets.connect(f"{gw.url}?call_id={c.call_id}", additional_headers=other) as side:
            refused = orjson.loads(await asyncio.wait_for(side.recv(), 10))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(side.recv(), 10)
        assert refused["error"]["code"] == Code.CALL_NOT_FOUND and closed.value.rcvd.code == 4004  # type: ignore[union-attr]
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{gw.http}/v1/realtime/calls/{c.call_id}/hangup", headers=other)
            assert r.status_code == 404 and r.json()["error"]["code"] == Code.CALL_NOT_FOUND
        assert c.browser.pc.connectionState == "connected"  # undisturbed


async def test_a_client_secret_of_the_calls_principal_opens_no_sideband(gw: RunningGateway) -> None:
    """Issue 33, finding 5: a secret (a browser's credential) read the call's events and
    rewrote its instructions through ?call_id=; it opens only the session it was minted for."""
    async with httpx.AsyncClient() as http:
        minted = (await http.post(f"{gw.http}/v1/realtime/client_secrets", headers=AUTH, json={})).json()
    async with call(gw) as c:
        protocols = ["realtime", f"openai-insecure-api-key.{minted['value']}"]
        async with websockets.connect(f"{gw.url}?call_id={c.call_id}", subprotocols=protocols) as side:  # type: ignore[list-item]
            refused = orjson.loads(await asyncio.wait_for(side.recv(), 10))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(side.recv(), 10)
        assert refused["error"]["code"] == Code.CLIENT_SECRET_WRONG_TYPE and closed.value.rcvd.code == 4003  # type: ignore[union-attr]
        assert "session.updated" not in c.types()


async def test_a_hangup_ends_the_call_and_its_session(gw: RunningGateway) -> None:
    async with call(gw) as c:
        sid = c.events[0]["session"]["id"]
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{gw.http}/v1/realtime/calls/{c.call_id}/hangup", headers=AUTH)
            assert r.status_code == 200
            await wait_for(lambda: c.browser.pc.connectionState in ("closed", "failed"), "the call to end")
            await wait_for(lambda: sid not in gw.runtime.hosts, "the session to end")
            assert await gw.runtime.store.load_snapshot(sid) is None  # for good: nothing to resume
            again = await http.post(f"{gw.http}/v1/realtime/calls/{c.call_id}/hangup", headers=AUTH)
            assert again.status_code == 404


async def test_a_message_that_is_not_json_is_answered_on_the_channel_and_the_call_goes_on(
    gw: RunningGateway,
) -> None:
    async with call(gw) as c:
        assert c.browser.channel is not None
        c.browser.channel.send("this is not json")
        error = await c.wait_for("error")
        assert error["error"]["code"] == Code.INVALID_JSON
        c.send({"type": "conversation.item.retrieve", "item_id": "nope", "event_id": "ask"})
        missing = await c.wait_for("error", after=c.events.index(error) + 1)
        assert (missing["error"]["code"], missing["error"]["event_id"]) == (Code.ITEM_NOT_FOUND, "ask")


@pytest.mark.parametrize(
    ("offer", "code"),
    [
        ("not an offer at all", "invalid_offer"),
        (
            "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n"
            "c=IN IP4 0.0.0.0\r\na=mid:0\r\na=sctp-port:5000\r\n",
            "offer_no_audio",
        ),
    ],
    ids=["not-sdp", "no-audio"],
)
async def test_a_bad_offer_is_refused_before_any_media(gw: RunningGateway, offer: str, code: str) -> None:
    r = await post_offer(gw, offer, AUTH)
    assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == "sdp"
    assert not gw.runtime.calls.calls  # type: ignore[union-attr]


async def test_refusals_come_in_openais_shape(gw: RunningGateway) -> None:
    browser, offer = await make_browser()
    try:
        assert (await post_offer(gw, offer, {})).status_code == 401
        r = await post_offer(gw, offer, {**AUTH, "Origin": "https://evil.example"})
        assert r.status_code == 403 and r.json()["error"]["code"] == Code.ORIGIN_NOT_ALLOWED
        async with httpx.AsyncClient() as http:
            smell = b'{"type": "realtime", "output_modalities": ["smell"]}'
            r = await http.post(f"{gw.http}/v1/realtime/calls", headers=AUTH, files={
                "sdp": (None, offer, "application/sdp"), "session": (None, smell, "application/json")})  # fmt: skip
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "session.output_modalities"  # checked as a client secret's would be
        resume = orjson.dumps({"session_id": "sess_nope", "resume_token": "rt_x"}).decode()
        r = await post_offer(gw, offer, {**AUTH, "X-Omni-Resume": resume})
        assert r.status_code == 404 and r.json()["error"]["code"] == Code.SESSION_NOT_FOUND
        r = await post_offer(gw, offer, AUTH)
        assert r.status_code == 201  # after all that, the same offer still makes a call
    finally:
        await browser.close()
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{gw.http}/v1/realtime/calls/rtc_nope/hangup", headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == Code.CALL_NOT_FOUND


async def test_a_peer_that_never_completes_ice_is_hung_up_and_its_session_stays_resumable() -> None:
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), detach_grace_s=30.0,
                        webrtc_ice_timeout_s=1.0)  # fmt: skip
    async with run_gateway(settings, engine=PassthroughEngine(), vad_factory=False) as gw:
        browser, offer = await make_browser()
        r = await post_offer(gw, offer, AUTH)
        await browser.close()  # it never applies the answer: no ICE, no DTLS, no channel
        assert r.status_code == 201
        await wait_for(lambda: not gw.runtime.calls.calls, "the watchdog to hang up")  # type: ignore[union-attr]
        (host,) = gw.runtime.hosts.values()
        assert not host.ended and host.doors == []  # detached: resumable for the grace period


async def test_a_re_offer_to_the_same_replica_takes_the_session_over_from_the_old_call(gw: RunningGateway) -> None:
    async with call(gw) as first:
        first.send({"type": "conversation.item.create", "item": TEXT})
        await first.wait_for("conversation.item.done")
        created = first.events[0]
        last = first.events[-1]["server_event_seq"]
        resume = {
            "session_id": created["session"]["id"],
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": last - 1,
        }  # fmt: skip (it missed the last event)
        async with call(gw, {**AUTH, "X-Omni-Resume": orjson.dumps(resume).decode()}) as second:
            resumed = await second.wait_for("session.resumed")
            assert resumed["replay_from"] == last and second.call_id == first.call_id
            replayed = await second.wait_for("conversation.item.done")
            assert replayed["server_event_seq"] == last  # the one it missed, once
            await wait_for(lambda: first.browser.pc.connectionState in ("closed", "failed"), "the old call to end")
            (live,) = gw.runtime.calls.calls.values()  # type: ignore[union-attr]
            assert live.door is not None and live.door.host is not None
            sessions = gw.runtime.metrics.sessions._value.get()  # the gauge counts the one call left
            assert sessions == 1, sessions
            second.send({"type": "response.create"})
            assert (await second.wait_for("response.done"))["response"]["status"] == "completed"


async def test_a_tenants_limits_and_models_hold_for_calls_as_for_sockets() -> None:
    import hashlib

    acme = "sk-webrtc-acme"
    tenant = {"name": "acme", "key_sha256": hashlib.sha256(acme.encode()).hexdigest(),
              "limits": {"max_sessions": 1}, "models": ["omni-cascade"]}  # fmt: skip
    tenants = orjson.dumps({"tenants": [tenant]}).decode()
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,), keys_file=tenants)
    async with run_gateway(settings, engine=PassthroughEngine(), vad_factory=False) as gw:
        headers = {"Authorization": f"Bearer {acme}"}
        async with call(gw, headers):  # the tenant's one session...
            browser, offer = await make_browser()
            try:
                r = await post_offer(gw, offer, headers)  # ...and no second, call or socket
                assert r.status_code == 429 and r.json()["error"]["code"] == Code.RATE_LIMIT_EXCEEDED, r.text
            finally:
                await browser.close()
        browser, offer = await make_browser()
        try:
            async with httpx.AsyncClient(timeout=30) as http:
                # served (an alias of the default model), but not on the tenant's list
                session = orjson.dumps({"type": "realtime", "model": "gpt-realtime"})
                form = {"sdp": (None, offer, "application/sdp"), "session": (None, session, "application/json")}
                r = await http.post(f"{gw.http}/v1/realtime/calls", headers=headers, files=form)
            assert r.status_code == 403 and r.json()["error"]["code"] == Code.MODEL_NOT_ALLOWED, r.text
        finally:
            await browser.close()


async def test_a_tenants_input_audio_limit_stops_a_calls_microphone_with_one_error(tmp_path: Any) -> None:
    import hashlib

    from rtc_support import tone, write_wav

    acme = "sk-webrtc-acme-audio"
    tenant = {"name": "acme", "key_sha256": hashlib.sha256(acme.encode()).hexdigest(),
              "limits": {"audio_in_s_per_min": 1, "events_per_s": 5}}  # fmt: skip
    settings = Settings(engine="passthrough", video_engine="none", api_keys=(KEY,),
                        keys_file=orjson.dumps({"tenants": [tenant]}).decode())  # fmt: skip
    # The limit is per minute of the store's clock (the memory store's is time.monotonic): a call
    # that crossed into the next minute is allowed a second second of audio (and told twice).
    # Start where the whole call fits in one minute, and count the minutes it touched (a loaded
    # machine can take long to set the call up).
    if time.monotonic() % 60 > 40:
        await asyncio.sleep(60.5 - time.monotonic() % 60)
    first_minute = time.monotonic() // 60
    async with run_gateway(settings, engine=PassthroughEngine(), vad_factory=False) as gw:
        wav = write_wav(tmp_path / "tone.wav", tone(440, 4000, 48000), 48000)  # 4 s of microphone
        browser, offer = await make_browser(wav=wav)
        events: list[dict[str, Any]] = []
        try:
            r = await post_offer(gw, offer, {"Authorization": f"Bearer {acme}"})
            assert r.status_code == 201, r.text
            assert browser.channel is not None
            browser.channel.on("message", lambda m: events.append(orjson.loads(m)))
            await browser.pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
            # 50 chunks a second of microphone, a limit of 5 messages a second: the track's
            # audio is not messages. Past 1 s of audio the limit of audio stops it, said once.
            await wait_for(lambda: any(e["type"] == "error" for e in events), "the audio limit", 30)
            (live,) = gw.runtime.calls.calls.values()  # type: ignore[union-attr]
            await wait_for(lambda: live._audio_in is not None and live._audio_in.chunks >= 150, "3 s of microphone")
            errors = [e["error"]["code"] for e in events if e["type"] == "error"]
            (host,) = gw.runtime.hosts.values()
            minutes = int(time.monotonic() // 60 - first_minute) + 1  # (1 but on a machine too slow for it)
            assert errors[:1] == [Code.RATE_LIMIT_EXCEEDED] and len(errors) <= minutes, errors
            assert set(errors) == {Code.RATE_LIMIT_EXCEEDED}, errors
            assert 900 <= host.session.audio_ms <= 1100 * minutes  # 1 s a minute taken, the rest dropped
        finally:
            await browser.close()
