"""WebRTC settings: ICE servers in both string forms, the port range, advertised addresses."""

from __future__ import annotations

import importlib.util

import pytest

from gateway.transport.webrtc.config import IceServer, WebRTCConfig, parse_ice_servers, parse_port_range


def test_ice_servers_as_urls() -> None:
    servers = parse_ice_servers("stun:stun.example.com:3478, turn:alice:s%3Acret@turn.example.com:3478?transport=tcp")
    assert servers == (
        IceServer(urls=("stun:stun.example.com:3478",)),
        IceServer(urls=("turn:turn.example.com:3478?transport=tcp",), username="alice", credential="s:cret"),
    )
    assert parse_ice_servers(["stun:[2001:db8::1]:3478"]) == (IceServer(urls=("stun:[2001:db8::1]:3478",)),)
    assert parse_ice_servers(None) == () == parse_ice_servers("  ")


def test_ice_servers_as_json() -> None:
    raw = (
        '[{"urls": ["turn:t.example.com", "turns:t.example.com:5349"], "username": "1700000000:u", "credential": "x"}]'
    )
    (server,) = parse_ice_servers(raw)
    assert server.urls == ("turn:t.example.com", "turns:t.example.com:5349") and server.username == "1700000000:u"
    assert server.to_client() == {
        "urls": ["turn:t.example.com", "turns:t.example.com:5349"],
        "username": "1700000000:u",
        "credential": "x",
    }


@pytest.mark.parametrize(
    "raw",
    [
        "http://example.com",
        "stun:host?transport=udp",  # STUN takes no transport
        "turn:turn.example.com",  # TURN without credentials
        "[{",
        '{"urls": "stun:x"}',
        '[{"username": "u"}]',
        '[{"urls": [1]}]',
    ],
)
def test_bad_ice_servers_fail_at_start_up(raw: str) -> None:
    with pytest.raises(ValueError):
        parse_ice_servers(raw)


def test_port_range() -> None:
    assert parse_port_range("40000-40199") == (40000, 40199)
    assert parse_port_range(" 5000 : 5000 ") == (5000, 5000)
    assert parse_port_range("") is None and parse_port_range(None) is None
    for bad in ("40000", "2-1", "0-10", "1-70000", "a-b"):
        with pytest.raises(ValueError):
            parse_port_range(bad)


def test_config_from_strings_and_validation() -> None:
    config = WebRTCConfig.from_strings(
        ice_servers="stun:a.example.com,stun:b.example.com,turn:u:p@t1.example.com,turn:u:p@t2.example.com",
        udp_ports="40000-40099",
        advertised_addresses="203.0.113.7, 2001:db8::7",
    )
    assert config.udp_port_range == (40000, 40099)
    assert config.advertised_addresses == ("203.0.113.7", "2001:db8::7")
    assert len(config.client_ice_servers()) == 4  # clients get every server
    # the gateway's own agent: one STUN and one TURN (aiortc would skip the others silently)
    assert [s.urls for s in config.gateway_ice_servers()] == [("stun:a.example.com",), ("turn:t1.example.com",)]
    with pytest.raises(ValueError):
        WebRTCConfig(advertised_addresses=("gateway.example.com",))
    with pytest.raises(ValueError):
        WebRTCConfig(peer_timeout_s=0)


@pytest.mark.skipif(importlib.util.find_spec("aiortc") is None, reason="aiortc is not installed")
def test_rtc_configuration_passes_an_explicit_empty_server_list() -> None:
    # None would make aiortc use Google's STUN server: a lookup and up to 5 s per call offline.
    assert WebRTCConfig().rtc_configuration().iceServers == []
    turn = WebRTCConfig.from_strings(ice_servers="turn:u:p@t.example.com:3478").rtc_configuration().iceServers
    assert turn is not None and turn[0].urls == ["turn:t.example.com:3478"] and turn[0].username == "u"
