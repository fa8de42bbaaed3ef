"""Shape bounds (gateway/protocol/bounds.py): nesting and size are refused at decode,
before anything is copied, snapshotted or echoed; the audio append is not walked."""

from __future__ import annotations

import pytest

from gateway.protocol import client_events as ce
from gateway.protocol.bounds import MAX_DEPTH, MAX_NODES, shape_violation
from gateway.protocol.errors import Code, ProtocolError


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [MAX_DEPTH, 254, 255, 300, 330, 1000])
def test_deep_nesting_anywhere_is_a_coded_error_naming_the_path(depth: int) -> None:
    raw = f'{{"type": "session.update", "event_id": "e1", "session": {{"tools": {nested(depth)}}}}}'
    with pytest.raises(ProtocolError) as info:
        ce.decode(raw)
    assert info.value.code in (Code.INVALID_VALUE, Code.INVALID_JSON)  # orjson itself stops at 1024
    if depth < 1024:
        assert info.value.code == Code.INVALID_VALUE
        assert info.value.event_id == "e1"
        assert info.value.param is not None and info.value.param.startswith("session.tools")


def test_nesting_within_the_bound_passes_the_walk() -> None:
    data = {"type": "x", "session": {"tools": [{"parameters": {"properties": {"a": {"type": "string"}}}}]}}
    assert shape_violation(data) is None


def test_too_many_values_in_one_event_is_refused() -> None:
    data = {"type": "conversation.item.create", "item": {"content": [0] * (MAX_NODES + 1)}}
    found = shape_violation(data)
    assert found is not None and "values" in found[0] and found[1] == "item.content"


def test_the_audio_append_hot_path_is_not_walked() -> None:
    event = ce.decode('{"type": "input_audio_buffer.append", "audio": "AAAA", "extra": ' + nested(100) + "}")
    assert isinstance(event, ce.AudioAppend)


def test_instructions_past_their_bound_are_refused_and_nothing_is_applied() -> None:
    from gateway.protocol.bounds import MAX_INSTRUCTIONS_BYTES
    from gateway.protocol.session_config import ConfigLimits, SessionConfig, apply_update

    config = SessionConfig(model="m")
    longest = "é" * (MAX_INSTRUCTIONS_BYTES // 2)  # two bytes each: exactly the bound
    ga = {"type": "realtime", "instructions": longest}
    assert apply_update(config, ga, beta=False, limits=ConfigLimits())[0].instructions == longest
    for beta, update in ((False, {**ga, "instructions": longest + "a"}), (True, {"instructions": longest + "a"})):
        with pytest.raises(ProtocolError) as refused:
            apply_update(config, update, beta=beta, limits=ConfigLimits())
        assert refused.value.code == "string_above_max_length" and refused.value.param == "session.instructions"
        assert str(MAX_INSTRUCTIONS_BYTES) in refused.value.message
