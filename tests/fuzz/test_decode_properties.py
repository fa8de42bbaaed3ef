"""Property tests (hypothesis) of the protocol's edge, without sockets: any JSON a
client can send, in any field of any client event, is either handled or refused with
a coded ``ProtocolError``; no other exception escapes the decoder or the session, and
what the session keeps can always be snapshotted (orjson writes it)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.fuzz import VALID

from gateway.protocol import client_events as ce
from gateway.protocol.errors import ProtocolError
from gateway.protocol.session_config import SessionConfig
from gateway.session.session import RealtimeSession
from orchestrator.engines.passthrough import PassthroughEngine

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=40,
)  # fmt: skip


@st.composite
def hostile_events(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(VALID)))
    event: dict[str, Any] = {"type": kind, **orjson.loads(orjson.dumps(VALID[kind]))}
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([*event, "event_id", "extra"]))
        if key != "type":
            event[key] = draw(json_values)
        target = event.get(key)
        if isinstance(target, dict) and target:
            inner = draw(st.sampled_from(sorted(target)))
            target[inner] = draw(json_values)
    return event


def new_session() -> RealtimeSession:
    session = RealtimeSession(
        session_id="sess_fuzz", config=SessionConfig(model="m", turn_detection=None),
        engine=PassthroughEngine().info, beta=False, vad_factory=None,
    )  # fmt: skip
    session.start()
    session.take()
    return session


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(hostile_events(), min_size=1, max_size=6))
def test_any_event_is_handled_or_refused_with_a_code_and_the_state_snapshots(events: list[dict[str, Any]]) -> None:
    session = new_session()
    for event in events:
        try:
            decoded = ce.decode(orjson.dumps(event))
        except ProtocolError as err:
            assert err.code
            continue
        if isinstance(decoded, ce.SessionResume | ce.EventAck):
            continue  # the transport's, not the session's
        try:
            session.handle(decoded)
        except ProtocolError as err:  # the transport turns these into error events
            assert err.code
        out, _ = session.take()
        for e in out:
            assert orjson.dumps(e)
            if e["type"] == "error":
                assert e["error"]["code"]
    assert orjson.dumps(session.snapshot_state())


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_decode_to_an_event_or_a_coded_error(raw: bytes) -> None:
    try:
        ce.decode(raw)
    except ProtocolError as err:
        assert err.code
