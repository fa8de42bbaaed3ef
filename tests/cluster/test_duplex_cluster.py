"""A client written to vLLM-Omni's duplex document holds its session through the
death of the replica that served it (nginx round-robin, redis-server, three
``--engine passthrough`` replicas: ``conftest.py``).

The client is ``support.duplex_client.DocDuplexClient``: it behaves as the
document's ``DuplexClient`` does (an ack after every event with a seq, a
heartbeat, playback acks, a barge-in, ``session.resume`` with its last seq on
a new ``?autostart=0`` socket after a drop, upstream's backoff). The replica
holding the session's lease is SIGKILLed in the middle of an answer, at
whatever moment (a duplex socket is sent only what the store has committed,
so the client is never ahead of the journal and never resynced); the client
reconnects through nginx to a live replica, which takes the session
over from Redis (the duplex dialect's resume is the same takeover as every
dialect's). Proved, every time:

- no ``error`` event reaches the client, and no ``session.resync_required``;
- the seq the client sees goes 1, 2, 3... with no gap and no repeat (replayed
  duplicates are dropped by seq, as the document's client does);
- the interrupted answer ends (``response.done`` ``incomplete``, reason
  ``replica_lost``, or ``completed`` when the journal held all of it) and an
  answer completes whole (50 words, 1000 ms of audio);
- the session goes on: playback acks, a barge-in, and ``session.close``.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING

import pytest
from support import upstream_docs as doc
from support.duplex_client import Answer, DocDuplexClient

if TYPE_CHECKING:
    from conftest import Harness

pytestmark = pytest.mark.timeout(240)

KILLS = int(os.environ.get("OMNI_CLUSTER_DUPLEX_KILLS", "5"))
FULL = "".join(f"w{i} " for i in range(50))


async def test_a_client_written_to_the_duplex_document_resumes_after_a_replica_kill(harness: Harness) -> None:
    for i in range(KILLS):
        await harness.ensure_all_up()
        print(await kill_once(harness, kill_after_ms=100 + 60 * i))


async def kill_once(harness: Harness, *, kill_after_ms: int) -> str:
    """One session, its replica killed ``kill_after_ms`` into an answer; returns a summary."""
    headers = {"Authorization": f"Bearer {harness.api_key}"}
    async with DocDuplexClient(
        harness.cluster.url, model="omni-cascade", headers=headers, heartbeat_interval_s=0.5
    ) as dc:
        assert dc.session_id is not None
        owner = await harness.wait_owner(dc.session_id)
        await dc.append(doc.pcm16(300))
        await dc.commit()
        first = await answer(dc)
        await dc.wait(lambda: first.audio_ms >= kill_after_ms, 20)
        await dc.ack_playback(first.audio_ms, response_id=first.response_id)
        # The journal holds everything the client has, whenever the kill comes.
        assert await harness.journal_last(dc.session_id) >= (dc.last_seq or 0)
        harness.cluster.kill_replica(owner, signal.SIGKILL)
        await dc.wait(lambda: dc.resumes == 1, 30)
        await dc.wait(lambda: completed(dc) is not None, 30)
        done = first.done
        assert done is not None, "the interrupted answer never ended"
        status = done["response"]["status"]
        assert status == "completed" or done["response"]["status_details"]["gateway_reason"] == "replica_lost"
        whole = completed(dc)
        assert whole is not None and whole.transcript == FULL and whole.audio_ms == 1000
        new_owner = await harness.wait_owner(dc.session_id)
        assert new_owner != owner
        # The session goes on at the new replica: playback truth, a barge-in, a close.
        await dc.ack_playback(whole.audio_ms, response_id=whole.response_id)
        await dc.append(doc.pcm16(300))
        await dc.commit()
        barged = await answer(dc, known=set(dc.answers))
        await dc.wait(lambda: barged.audio_ms >= 200, 20)
        await dc.barge_in()
        await dc.wait(lambda: barged.done is not None, 20)
        assert barged.done is not None and barged.done["response"]["status_details"]["reason"] == "barge_in"
        await dc.close()
    assert [e for e in dc.events if e["type"] in ("error", "session.resync_required")] == [], dc.types()
    seqs = [e["server_event_seq"] for e in dc.events if "server_event_seq" in e]
    assert seqs == list(range(1, len(seqs) + 1)), "the client saw a gap or a repeat"
    assert dc.closed == "closed" and dc.heartbeats_sent >= 1
    return (f"killed replica {owner} at {kill_after_ms} ms -> replica {new_owner}; first answer {status}; "
            f"{len(seqs)} events, {dc.duplicates} replayed duplicates dropped")  # fmt: skip


def completed(dc: DocDuplexClient) -> Answer | None:
    return next((a for a in dc.answers.values() if a.done and a.done["response"]["status"] == "completed"), None)


async def answer(dc: DocDuplexClient, known: set[str] | None = None) -> Answer:
    seen = known or set()
    await dc.wait(lambda: any(rid not in seen for rid in dc.answers), 20)
    return next(a for rid, a in dc.answers.items() if rid not in seen)
