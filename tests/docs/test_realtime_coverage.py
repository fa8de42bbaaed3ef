"""The *Coverage of the GA API* tables (docs/realtime-coverage.md) match the official SDK's models
and the code: every GA client event, server event and session field is listed
once, and each status says what the code does."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pydantic
import pytest
from openai.types.realtime import RealtimeClientEvent, RealtimeServerEvent, RealtimeSessionCreateRequest
from openai.types.realtime.realtime_audio_config_input import NoiseReduction
from openai.types.realtime.realtime_audio_input_turn_detection import SemanticVad, ServerVad

from gateway.protocol import client_events as ce
from gateway.protocol.session_config import GATEWAY_IGNORED, WARN_PATHS
from orchestrator.engines.cascade.engine import IGNORED_FIELDS as CASCADE_IGNORED
from orchestrator.engines.cascade.engine import TOOL_FIELDS
from orchestrator.engines.passthrough import PassthroughEngine
from orchestrator.engines.vllm_engine import IGNORED_FIELDS as VLLM_IGNORED

ROOT = Path(__file__).resolve().parents[2]
# The OpenAI dialects' session (the duplex dialect's modules, duplex*.py, spell events their own way).
SESSION_SOURCES = sorted(p for p in (ROOT / "gateway" / "session").glob("*.py") if not p.name.startswith("duplex"))
STATUSES = {"supported", "passed to the engine", "accepted and reported", "not applicable over WebSocket", "not sent"}


def table(heading: str) -> dict[str, str]:
    """``name -> status`` of the table under ``## heading`` in docs/realtime-coverage.md."""
    text = (ROOT / "docs" / "realtime-coverage.md").read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+?) \|", section, re.M)
    names = [name for name, _ in rows]
    assert len(names) == len(set(names)), f"{heading}: a row repeats"
    statuses = dict(rows)
    assert set(statuses.values()) <= STATUSES, set(statuses.values()) - STATUSES
    return statuses


def union_types(union: object) -> set[str]:
    members = typing.get_args(typing.get_args(union)[0]) if typing.get_origin(union) is typing.Annotated else ()
    members = members or typing.get_args(union)
    return {typing.get_args(m.model_fields["type"].annotation)[0] for m in members}


def emitted() -> set[str]:
    """Every server event type the session code emits."""
    names: set[str] = set()
    for path in SESSION_SOURCES:
        names |= set(re.findall(r'(?<![A-Za-z0-9])_?emit(?:_audio)?\(\s*"([a-z_.]+)"', path.read_text()))
    return names


def session_fields() -> set[str]:
    """The SDK's session request fields, as leaves (turn detection and noise reduction by field)."""

    def leaves(model: type[pydantic.BaseModel], prefix: str) -> set[str]:
        out: set[str] = set()
        for name, info in model.model_fields.items():
            path = f"{prefix}{name}"
            nested = [a for a in (info.annotation, *typing.get_args(info.annotation)) if isinstance(a, type)]
            models = [a for a in nested if issubclass(a, pydantic.BaseModel)]
            if path in ("audio", "audio.input", "audio.output", "audio.input.transcription") and models:
                out |= leaves(models[0], path + ".")
            else:
                out.add(path)
        return out

    fields = leaves(RealtimeSessionCreateRequest, "")
    fields.discard("audio.input.turn_detection")
    fields.discard("audio.input.noise_reduction")
    for model in (ServerVad, SemanticVad):
        fields |= {f"audio.input.turn_detection.{name}" for name in model.model_fields}
    fields |= {f"audio.input.noise_reduction.{name}" for name in NoiseReduction.model_fields}
    return fields


def test_every_ga_client_event_is_listed_and_handled_as_its_status_says() -> None:
    rows = table("Client events")
    assert set(rows) == union_types(RealtimeClientEvent)
    for name, status in rows.items():
        assert name in ce.CLIENT_EVENT_TYPES, f"{name} is not even decoded"
        decoded = type(ce.decode(b'{"type": "%s", "session": {}, "audio": "", "item_id": "i", "content_index": 0, '
                                 b'"audio_end_ms": 0, "item": {"type": "message", "role": "user", "content": '
                                 b'[{"type": "input_text", "text": "x"}]}}' % name.encode()))  # fmt: skip
        assert (decoded is ce.OutputAudioClear) == (status == "not applicable over WebSocket"), name


def test_every_ga_server_event_is_listed_and_sent_exactly_when_supported() -> None:
    rows = table("Server events")
    assert set(rows) == union_types(RealtimeServerEvent)
    sent = emitted()
    for name, status in rows.items():
        assert (name in sent) == (status == "supported"), f"{name}: {status}, but {'' if name in sent else 'not '}sent"


def test_every_ga_session_field_is_listed_with_the_status_the_code_gives_it() -> None:
    rows = table("Session fields")
    assert set(rows) == session_fields()
    by_path = {ga: key for key, (ga, _beta) in WARN_PATHS.items() if key != "tools.mcp"}
    engines_ignore = (
        set(CASCADE_IGNORED) | set(TOOL_FIELDS) | set(VLLM_IGNORED) | set(PassthroughEngine().info.ignored_fields)
    )
    for name, status in rows.items():
        key = by_path.get(name) or by_path.get(name.rsplit(".", 1)[0])  # noise_reduction.type -> noise_reduction
        if status == "accepted and reported":
            assert key in GATEWAY_IGNORED, name
        elif status == "passed to the engine":
            assert key is not None and key not in GATEWAY_IGNORED, name
        else:
            assert status == "supported", name
            assert key not in GATEWAY_IGNORED and key not in engines_ignore, f"{name}: an engine ignores it"


@pytest.mark.parametrize("heading", ["Client events", "Server events", "Session fields"])
def test_the_tables_can_fail(heading: str) -> None:
    """The checks above read real rows (not an empty table that would pass)."""
    assert len(table(heading)) > 10
