"""docs/live.md's *Coverage* tables hold every GPT-Live event of the official SDK
(openai-python's ``openai.types.live`` unions), each once, with a status from the
page's legend; and the *Errors* table names every Live code the gateway sends."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

live = pytest.importorskip("openai.types.live")

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "live.md"
STATUSES = {"supported", "refused", "not sent"}


def table(heading: str) -> dict[str, str]:
    """``name -> status`` of the table under ``### heading`` in docs/live.md."""
    section = PAGE.read_text().split(f"### {heading}\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+?) \|", section, re.M)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), f"{heading}: a row repeats"
    statuses = dict(rows)
    assert set(statuses.values()) <= STATUSES, set(statuses.values()) - STATUSES
    return statuses


def union_types(*unions: object) -> set[str]:
    out: set[str] = set()
    for union in unions:
        members = typing.get_args(typing.get_args(union)[0]) if typing.get_origin(union) is typing.Annotated else ()
        for member in members or typing.get_args(union):
            out.add(typing.get_args(member.model_fields["type"].annotation)[0])
    return out


def test_every_live_client_event_is_in_the_table() -> None:
    assert set(table("Client events")) == union_types(live.ClientEvent, live.ConnectClientEvent)


def test_every_live_server_event_is_in_the_table() -> None:
    assert set(table("Server events")) == union_types(live.ServerEvent, live.ConnectServerEvent)


def test_the_refused_client_events_are_refused_by_the_decoder() -> None:
    """A client event the table calls supported decodes; one it calls refused never reaches a
    session as a command it runs (the decoder or the session answers it with an error)."""
    from gateway.protocol import live_events as le

    for name, status in table("Client events").items():
        if name.startswith("decision."):
            assert status == "refused"
            with pytest.raises(Exception, match="Decisions"):
                le.decode(f'{{"type": "{name}", "event_id": "e"}}')
        else:
            assert name in le.CLIENT_EVENT_TYPES, name


def test_every_live_error_code_is_in_the_errors_table() -> None:
    from gateway.hosting import responses_backend as backend
    from gateway.protocol import live_config, live_events
    from gateway.session import live as live_session
    from gateway.session import live_delegation as delegation

    section = PAGE.read_text().split("## Errors\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", section))
    codes = {live_config.DECISIONS_UNSUPPORTED, live_events.DECISIONS_UNSUPPORTED, live_session.FIXTURE_ACTIVE,
             live_session.DELEGATION_NOT_FOUND, delegation.RESPONSES_DELEGATION_REQUIRED, "session_not_open",
             "session_already_started", "unknown_parameter", "unknown_event", "session_not_found",
             delegation.RESPONSES_BACKEND_UNCONFIGURED, "conversation_already_has_active_response",
             backend.UNCONFIGURED, backend.UNREACHABLE, backend.HTTP_ERROR, backend.TIMEOUT,
             backend.INVALID}  # fmt: skip
    assert codes <= listed, codes - listed
