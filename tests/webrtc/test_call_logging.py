"""What a call logs when its peer cannot keep up (issue 33, a Low finding): once judged a
slow consumer it says so once and hangs up, however much the session still says (was: a
WARNING per event, 1,652 lines for one flooded call); events too large for the peer's
channel are logged at most once every ``TOO_LARGE_LOG_S``."""

from __future__ import annotations

import logging

import pytest
from rtc_support import loopback_config

from gateway.protocol.errors import CloseCode
from gateway.transport.webrtc.call import Call
from gateway.transport.webrtc.datachannel import ChannelOverflow, MessageTooLarge
from gateway.transport.webrtc.peer import PeerFactory

DELTA = b'{"type":"response.output_text.delta","delta":"x"}'


class Refusing:
    """A data channel that refuses every send the way the real one does when it must."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.sent = 0

    def send(self, data: object) -> bool:
        self.sent += 1
        raise self.error

    def close(self) -> None:
        pass


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "omni.webrtc"]


async def test_a_slow_consumer_is_said_once_and_hung_up_once(caplog: pytest.LogCaptureFixture) -> None:
    call = Call("rtc_slow", PeerFactory(loopback_config()), on_ended=lambda c: None, max_message_size=65536)
    closes: list[int] = []
    call.close = lambda code, reason: closes.append(code)  # type: ignore[method-assign]
    call.channel = Refusing(ChannelOverflow("4194305 bytes buffered on the data channel"))  # type: ignore[assignment]
    try:
        for _ in range(500):
            call.send(DELTA, {"type": "response.output_text.delta"})
        assert len(warnings(caplog)) == 1 and "slow consumer" in warnings(caplog)[0]
        assert closes == [CloseCode.SLOW_CONSUMER]
    finally:
        await call.pc.close()


async def test_events_too_large_for_the_channel_are_logged_at_most_every_few_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = Call("rtc_large", PeerFactory(loopback_config()), on_ended=lambda c: None, max_message_size=65536)
    call.channel = Refusing(MessageTooLarge("a 70000-byte event is over the peer's 65536-byte limit"))  # type: ignore[assignment]
    try:
        for _ in range(300):
            call.send(DELTA, {"type": "response.output_text.delta"})
        assert len(warnings(caplog)) == 1
        assert not call.slow  # (a large event is no slow consumer: the call goes on)
    finally:
        await call.pc.close()
