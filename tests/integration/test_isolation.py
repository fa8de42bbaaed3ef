"""Cross-principal isolation, tried as an attacker would: Bob holds valid credentials
of his own and Alice's ids and tokens (seen in a log, a screenshot, a shared
link). Every attempt (resume, ack, interaction over the socket and over HTTP,
cancel, conversation edits, admin) is refused with a code that reveals nothing:
the answer is the one a session, response or item that does not exist gets, and
Alice's session goes on undisturbed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import websockets
from support.gateway import Client, RunningGateway, connect, run_gateway

from gateway.protocol.errors import Code
from gateway.settings import Settings
from orchestrator.engines.passthrough import PassthroughEngine

pytestmark = pytest.mark.timeout(90)

ALICE_KEY, BOB_KEY, OPERATOR = "sk-iso-alice-0001", "sk-iso-bob-0002", "sk-iso-operator-0003"
ALICE, BOB = {"Authorization": f"Bearer {ALICE_KEY}"}, {"Authorization": f"Bearer {BOB_KEY}"}


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


KEYS_FILE = orjson.dumps({"tenants": [{"name": "alice", "key_sha256": sha(ALICE_KEY)},
                                      {"name": "bob", "key_sha256": sha(BOB_KEY)}]}).decode()  # fmt: skip


@pytest.fixture
async def gw() -> AsyncIterator[RunningGateway]:
    s = Settings(engine="passthrough", api_keys=(OPERATOR,), keys_file=KEYS_FILE, detach_grace_s=0.3,
                 drain_window_s=0.2, video_engine="cpu")  # fmt: skip
    engine = PassthroughEngine(audio_chunks=40, chunk_ms=20, paced=True)  # a 0.8 s answer: time to interfere
    async with run_gateway(s, engine=engine, vad_factory=None) as gw:
        yield gw


async def manual(c: Client) -> dict[str, Any]:
    created = await c.wait_for("session.created")
    session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    await c.send({"type": "session.update", "session": session})
    await c.wait_for("session.updated")
    return created


def resume(sid: str, token: str, seq: int = 1, event_id: str = "r1") -> dict[str, Any]:
    return {"type": "session.resume", "session_id": sid, "resume_token": token,
            "last_received_server_event_seq": seq, "event_id": event_id}  # fmt: skip


async def refusal_of(c: Client, event: dict[str, Any]) -> dict[str, Any]:
    await c.send(event)
    err: dict[str, Any] = (await c.wait_for("error"))["error"]
    return err


def as_if_missing(err: dict[str, Any], missing: dict[str, Any], real_id: str, fake_id: str) -> None:
    """``err`` (about Alice's id) is exactly ``missing`` (about an id that never existed)."""
    assert err == {**missing, "message": missing["message"].replace(fake_id, real_id)}


async def test_resume_of_anothers_session_with_its_valid_token_answers_as_a_missing_session(
    gw: RunningGateway,
) -> None:
    async with connect(gw.url, headers=ALICE) as alice:
        created = await manual(alice)
        sid, token = created["session"]["id"], created["resume_token"]
        async with connect(gw.url, headers=BOB) as bob:
            await bob.wait_for("session.created")
            stolen = await refusal_of(bob, resume(sid, token))  # Alice's socket still attached: a live host
        async with connect(gw.url, headers=BOB) as bob:
            await bob.wait_for("session.created")
            missing = await refusal_of(bob, resume("sess_00000000000000000000", "rt_guess"))
        async with connect(gw.url, headers=BOB) as bob:
            await bob.wait_for("session.created")
            wrong = await refusal_of(bob, resume(sid, "rt_guess"))  # a wrong token: the same again
        for err in (stolen, wrong):
            as_if_missing(err, missing, sid, "sess_00000000000000000000")
        assert missing["code"] == Code.SESSION_NOT_FOUND
        # Alice was never disturbed: no replaced, and her session answers.
        await alice.send({"type": "input_audio_buffer.clear"})
        await alice.wait_for("input_audio_buffer.cleared")
        assert "session.replaced" not in alice.types()
    await asyncio.sleep(0.6)  # past the detach grace: the session now lives in the store only
    async with connect(gw.url, headers=BOB) as bob:
        await bob.wait_for("session.created")
        as_if_missing(await refusal_of(bob, resume(sid, token)), missing, sid, "sess_00000000000000000000")
    async with connect(gw.url, headers=ALICE) as alice:  # the token still works for its owner
        await alice.wait_for("session.created")
        await alice.send(resume(sid, token))
        await alice.wait_for("session.resumed")


async def test_an_ack_can_only_trim_the_acking_sockets_own_journal(gw: RunningGateway) -> None:
    async with connect(gw.url, headers=ALICE) as alice:
        created = await manual(alice)
        await alice.send({"type": "response.create"})
        last = await alice.wait_for("rate_limits.updated")  # (it follows response.done)
    sid, token, top = created["session"]["id"], created["resume_token"], last["server_event_seq"]
    async with connect(gw.url, headers=BOB) as bob:
        await bob.wait_for("session.created")
        for seq in (top, 10**6):  # an ack names no session: it can only be about Bob's own
            await bob.send({"type": "session.event_ack", "last_received_server_event_seq": seq})
        await asyncio.sleep(2.5)  # past the trim interval
    async with connect(gw.url, headers=ALICE) as alice:
        await alice.wait_for("session.created")
        await alice.send(resume(sid, token, seq=1))
        resumed = await alice.wait_for("session.resumed")
        assert (resumed["replay_from"], resumed["replay_to"]) == (2, top)  # nothing of Alice's was trimmed


async def test_cancel_and_item_edits_naming_anothers_ids_answer_as_unknown_ids(gw: RunningGateway) -> None:
    async with connect(gw.url, headers=ALICE) as alice, connect(gw.url, headers=BOB) as bob:
        await manual(alice)
        await manual(bob)
        await alice.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "alice's words"}]}})  # fmt: skip
        item_id = (await alice.wait_for("conversation.item.added"))["item"]["id"]
        await alice.send({"type": "response.create"})
        response_id = (await alice.wait_for("response.created"))["response"]["id"]

        async def same_as_unknown(event: dict[str, Any], field: str, real: str, fake: str) -> None:
            err = await refusal_of(bob, {**event, field: real})
            missing = await refusal_of(bob, {**event, field: fake})
            as_if_missing(err, missing, real, fake)

        await same_as_unknown({"type": "response.cancel"}, "response_id", response_id, "resp_nope0000")
        for kind, extra in (("retrieve", {}), ("delete", {}), ("truncate", {"content_index": 0, "audio_end_ms": 0})):
            await same_as_unknown({"type": f"conversation.item.{kind}", **extra}, "item_id", item_id, "item_nope0000")
        done = await alice.wait_for("response.done")
        assert done["response"]["status"] == "completed"  # Bob's cancel reached nothing
        assert not any("alice" in str(e) for e in bob.events)
        await alice.send({"type": "conversation.item.retrieve", "item_id": item_id})
        assert (await alice.wait_for("conversation.item.retrieved"))["item"]["id"] == item_id  # not deleted


async def test_interactions_reach_only_the_owners_stream(gw: RunningGateway) -> None:
    start = {"type": "session.start", "prompt": "A red fox", "width": 128, "height": 96, "fps": 24,
             "frames_per_chunk": 4}  # fmt: skip
    async with websockets.connect(gw.url + "/video", additional_headers=ALICE) as alice, \
            websockets.connect(gw.url + "/video", additional_headers=BOB) as bob:  # fmt: skip
        await alice.send(orjson.dumps(start).decode())
        await bob.send(orjson.dumps(start).decode())
        sids = {}
        for name, ws in (("alice", alice), ("bob", bob)):
            while True:
                message = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(message, str) and orjson.loads(message)["type"] == "video.start":
                    sids[name] = orjson.loads(message)["session_id"]
                    break
        # Over the socket: an interaction names no session; Bob's goes to Bob's stream.
        bob_event = {"event_id": "bob-1", "event": {"prompt": "A blue whale"}}
        await bob.send(orjson.dumps({"type": "session.interaction", "interaction": bob_event}).decode())
        # Over HTTP, naming Alice's session: exactly what a session that does not exist gets.
        async with httpx.AsyncClient(base_url=gw.http) as http:
            body = {"interaction": {"event_id": "bob-2", "event": {"prompt": "A blue whale"}}}
            stolen = await http.post(f"/v1/realtime/video/{sids['alice']}/interactions", json=body, headers=BOB)
            fake = "vsess_00000000000000000000"
            missing = await http.post(f"/v1/realtime/video/{fake}/interactions", json=body, headers=BOB)
            assert (stolen.status_code, missing.status_code) == (404, 404)
            as_if_missing(stolen.json()["error"], missing.json()["error"], sids["alice"], fake)
            own = await http.post(f"/v1/realtime/video/{sids['alice']}/interactions", json=body, headers=ALICE)
            assert own.status_code == 202  # the owner's own request is taken
        seen: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3
        while loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                message = await asyncio.wait_for(alice.recv(), deadline - loop.time())
                if isinstance(message, str):
                    seen.append(orjson.loads(message))
        assert "bob-1" not in str(seen)  # Bob's interaction never reached Alice's stream
        assert any(e.get("type") == "session.interaction.queued" for e in seen), [e.get("type") for e in seen]


async def test_admin_endpoints_refuse_tenant_keys_and_answer_the_operator(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.http) as http:
        for action in ("pause", "resume", "sleep", "wake_up", "engine_pause", "engine_resume", "nonexistent"):
            r = await http.post(f"/admin/{action}", headers=BOB)
            assert r.status_code == 403, (action, r.text)  # the same for every action: nothing about them
            assert r.json()["error"]["code"] == Code.FORBIDDEN
        assert not gw.runtime.orchestrator.paused
        r = await http.post("/admin/pause", headers={"Authorization": f"Bearer {OPERATOR}"})
        assert r.status_code == 200 and gw.runtime.orchestrator.paused
        await http.post("/admin/resume", headers={"Authorization": f"Bearer {OPERATOR}"})
