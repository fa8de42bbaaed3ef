"""GPT-Live's data-channel allow-lists (``gateway/protocol/live_channel.py``), pure: which
client events a page's channel may send and which server events it is sent."""

from __future__ import annotations

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol import live_events as le
from gateway.protocol.live_channel import CLIENT_EVENT_NOT_ALLOWED, ChannelPolicy, client_type


def decoded(event: dict[str, object]) -> object:
    return le.decode(orjson.dumps(event))


def test_every_live_client_event_has_its_wire_type() -> None:
    for kind in le.CLIENT_EVENT_TYPES:
        if kind in ("session.resume", "session.event_ack"):
            continue
        sample = {
            "session.start": {"session": {}}, "session.update": {"session": {}},
            "session.input_audio.append": {"audio": ""}, "session.output_audio.fixture.play": {"audio": "AAAAAA=="},
            "session.instructions.append": {"content": "x", "delegation_id": None},
            "session.thinking.append": {"content": "x", "delegation_id": None},
            "session.commentary.append": {"content": "x", "delegation_id": None},
            "response.item.create": {"item": {}}, "transport.dtmf.send": {"event": "1"},
        }.get(kind, {})  # fmt: skip
        assert client_type(decoded({"type": kind, **sample})) == kind


def test_omitted_or_all_allows_everything() -> None:
    for dc in (None, {}, {"allowed_client_events": "all", "allowed_server_events": "all"}):
        policy = ChannelPolicy.of(dc)
        assert policy.open
        assert policy.allows_client(le.Close(None))
        assert policy.allows_server({"type": "session.closed"}, b"")


def test_a_client_list_allows_what_it_names_and_refuses_the_rest() -> None:
    policy = ChannelPolicy.of({"allowed_client_events": ["session.input_audio.mute"]})
    assert policy.allows_client(le.InputMute(None, True))
    assert not policy.allows_client(le.InputMute(None, False))  # unmute is another event
    assert policy.allows_client(ce.EventAck(None, 3))  # the resume extension's: no Live event, never listed
    err = policy.refusal(le.Close("e1"))
    assert err.code == CLIENT_EVENT_NOT_ALLOWED and err.event_id == "e1" and "session.close" in err.message
    assert not ChannelPolicy.of({"allowed_client_events": []}).allows_client(le.Close(None))


def test_a_server_list_selects_types_and_responses_events() -> None:
    policy = ChannelPolicy.of({"allowed_server_events": [
        {"type": "error"}, {"type": "response.event", "response_event": "response.completed"},
    ]})  # fmt: skip
    assert policy.allows_server({"type": "error"}, b"")
    assert not policy.allows_server({"type": "session.updated"}, b"")
    assert policy.allows_server(None, b'{"type":"error","event_id":"e"}')  # a replay: read from its JSON
    assert policy.allows_server({"type": "response.event", "event": {"type": "response.completed"}}, b"")
    assert not policy.allows_server({"type": "response.event", "event": {"type": "response.created"}}, b"")
    assert "response.event (response.completed)" in policy.describe()
    assert not ChannelPolicy.of({"allowed_server_events": []}).allows_server({"type": "error"}, b"")
