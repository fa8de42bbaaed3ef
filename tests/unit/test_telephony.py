"""The carriers' pure parts: the Twilio codec and signature, and the paced playout's ledger."""

from __future__ import annotations

import base64

import orjson
import pytest

from gateway.protocol.telephony import (
    PCMU_8K,
    TWILIO,
    CarrierMessageError,
    Connected,
    DtmfIn,
    MarkIn,
    MediaIn,
    StreamStart,
    StreamStop,
)
from gateway.transport.telephony.endpoint import phone_session, signed_urls
from gateway.transport.telephony.playout import CHUNK_MS, LEAD_MS, Playout


def test_twilio_messages_decode_as_the_documents_show_them() -> None:
    assert isinstance(TWILIO.decode('{"event": "connected", "protocol": "Call", "version": "1.0.0"}'), Connected)
    start = TWILIO.decode(
        orjson.dumps(
            {
                "event": "start",
                "sequenceNumber": "1",
                "start": {
                    "accountSid": "AC1",
                    "streamSid": "MZ1",
                    "callSid": "CA1",
                    "tracks": ["inbound"],
                    "customParameters": {"client_secret": "ek_1"},
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                },
                "streamSid": "MZ1",
            }
        )
    )
    assert isinstance(start, StreamStart)
    assert (start.stream_id, start.call_id, start.parameters) == ("MZ1", "CA1", {"client_secret": "ek_1"})
    assert start.audio.codec == "pcmu" and start.audio.rate == 8000
    media = TWILIO.decode(
        orjson.dumps(
            {
                "event": "media",
                "media": {
                    "track": "inbound",
                    "chunk": "2",
                    "timestamp": "5",
                    "payload": base64.b64encode(b"\xff" * 160).decode(),
                },
            }
        )
    )
    assert media == MediaIn(b"\xff" * 160, 2)
    assert TWILIO.decode('{"event":"dtmf","dtmf":{"track":"inbound_track","digit":"#"}}') == DtmfIn("#")
    assert TWILIO.decode('{"event":"mark","mark":{"name":"7"}}') == MarkIn("7")
    assert isinstance(TWILIO.decode('{"event":"stop","stop":{"callSid":"CA1"}}'), StreamStop)
    assert TWILIO.decode('{"event":"something-new"}') is None  # a later version's event: ignored


@pytest.mark.parametrize(
    "message",
    [
        "not json",
        "[1]",
        '{"event":"media","media":{"payload":"%%%"}}',
        '{"event":"dtmf","dtmf":{"digit":"12"}}',
        '{"event":"mark","mark":{}}',
        '{"event":"start","start":{"streamSid":"MZ","callSid":"CA","mediaFormat":'
        '{"encoding":"audio/x-l16","sampleRate":16000,"channels":1}}}',
    ],
)
def test_what_does_not_decode_is_refused(message: str) -> None:
    with pytest.raises(CarrierMessageError):
        TWILIO.decode(message)


def test_twilio_output_messages() -> None:
    assert orjson.loads(TWILIO.media("MZ1", b"\x00\x01", PCMU_8K)) == {
        "event": "media", "streamSid": "MZ1", "media": {"payload": base64.b64encode(b"\x00\x01").decode()}}  # fmt: skip
    assert orjson.loads(TWILIO.mark("MZ1", "3")) == {"event": "mark", "streamSid": "MZ1", "mark": {"name": "3"}}
    assert orjson.loads(TWILIO.clear("MZ1")) == {"event": "clear", "streamSid": "MZ1"}


def test_the_signature_is_twilios_documented_example() -> None:
    """Twilio's "Webhooks security" worked example (its Auth Token 12345, its URL and POST
    parameters) and the signature it publishes."""
    params = {"CallSid": "CA1234567890ABCDE", "Caller": "+12349013030", "Digits": "1234", "From": "+12349013030",
              "To": "+18005551212"}  # fmt: skip
    assert TWILIO.signature("12345", "https://mycompany.com/myapp.php?foo=1&bar=2", params) == (
        "0/KCTR6DLpKmkAf8muzZqo1nDgQ="
    )
    url = "wss://example.com/v1/telephony/twilio"
    good = TWILIO.signature("tok", url)
    assert TWILIO.signed("tok", [url], good)
    assert not TWILIO.signed("tok", [url], None) and not TWILIO.signed("other", [url], good)


def test_the_signed_urls_are_the_carriers_and_the_one_seen() -> None:
    scope = {"scheme": "ws", "raw_path": b"/v1/telephony/twilio", "query_string": b"a=1"}
    assert signed_urls(scope, {"host": "gw.example.com"}) == [
        "wss://gw.example.com/v1/telephony/twilio?a=1", "ws://gw.example.com/v1/telephony/twilio?a=1"]  # fmt: skip


def test_a_phone_session_keeps_the_secrets_settings_with_the_carriers_format() -> None:
    minted = {"type": "realtime", "instructions": "hi", "audio": {"output": {"voice": "alloy"}}}
    session = phone_session(minted, PCMU_8K)
    assert session["instructions"] == "hi" and session["audio"]["output"]["voice"] == "alloy"
    assert session["audio"]["input"]["format"] == session["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    assert minted["audio"] == {"output": {"voice": "alloy"}}  # (not changed in place)


# --- the playout ---


def ms(n: int) -> bytes:
    return b"\x55" * (8 * n)


def test_an_answer_written_at_once_is_paced_never_more_than_the_lead_ahead() -> None:
    p = Playout()
    p.feed(ms(15_000), response_id="r1", item_id="i1")
    p.end_response("r1")
    now, sent_ms = 0.0, 0.0
    while sent_ms < 15_000:
        for chunk in p.due(now):
            sent_ms += len(chunk.audio) / 8
        assert sent_ms - now * 1000 <= LEAD_MS + 1e-6  # (the caller's ear is at now * 1000 ms)
        at = p.next_at(now)
        if at is None:
            break
        now = max(at, now + 0.001)
    assert sent_ms == 15_000
    assert p.chunks_sent == 15_000 // CHUNK_MS
    assert now * 1000 >= 15_000 - LEAD_MS - 1e-6  # it took real time, less the lead


def test_marks_say_what_was_played_and_a_clear_cuts_there() -> None:
    p = Playout()
    p.feed(ms(1000), response_id="r1", item_id="i1")
    chunks = p.due(0.0)
    assert [len(c.audio) // 8 for c in chunks] == [100, 100, 100] and chunks[0].first and not chunks[1].first
    assert p.echoed(chunks[0].mark) == ("r1", False)
    assert p.played_ms("i1") == 100
    assert p.echoed(chunks[2].mark) == ("r1", False)  # (in order: the one before it played too)
    assert p.played_ms("i1") == 300
    more = p.due(0.3)
    assert more
    cut = p.clear()
    assert cut is not None and (cut.response_id, cut.item_id, cut.audio_end_ms) == ("r1", "i1", 300)
    assert cut.dropped_ms == 700
    # The marks the carrier echoes as it empties its buffer say nothing was played.
    assert p.echoed(more[0].mark) is None and p.played_ms("i1") == 300
    # Late audio of the cut answer is dropped; another answer plays.
    p.feed(ms(200), response_id="r1", item_id="i1")
    assert p.queued_ms == 0 and p.playing is None
    p.feed(ms(200), response_id="r2", item_id="i2")
    assert p.due(0.4)[0].response_id == "r2"


def test_the_last_mark_of_an_ended_answer_says_it_stopped() -> None:
    p = Playout()
    p.feed(ms(150), response_id="r1", item_id="i1")
    p.end_response("r1")
    chunks = p.due(0.0)
    assert [len(c.audio) // 8 for c in chunks] == [100, 50]
    assert p.echoed(chunks[0].mark) == ("r1", False)
    assert p.echoed(chunks[1].mark) == ("r1", True)
    assert p.playing is None and p.clear() is None


def test_a_short_tail_waits_for_more_audio_unless_the_answer_ended() -> None:
    p = Playout()
    p.feed(ms(10), response_id="r1", item_id="i1")
    assert p.due(0.0) == [] and p.next_at(0.0) is None
    p.feed(ms(30), response_id="r1", item_id="i1")
    assert [len(c.audio) // 8 for c in p.due(0.0)] == [40]
    p.feed(ms(10), response_id="r1", item_id="i1")
    p.end_response("r1")
    assert [len(c.audio) // 8 for c in p.due(0.0)] == [10]


# --- the call webhook's signature and settings ---


def test_a_webhook_is_signed_as_standard_webhooks_says() -> None:
    import base64 as b64
    import hashlib
    import hmac

    from gateway.protocol.webhooks import sign_headers

    key = b"0123456789abcdef0123456789abcdef"
    secret = "whsec_" + b64.b64encode(key).decode()
    headers = sign_headers(secret, "evt_1", 1765116000, b'{"a":1}')
    expected = b64.b64encode(hmac.new(key, b'evt_1.1765116000.{"a":1}', hashlib.sha256).digest()).decode()
    assert headers == {"webhook-id": "evt_1", "webhook-timestamp": "1765116000", "webhook-signature": "v1," + expected}


@pytest.mark.parametrize("bad", ["not-whsec", "whsec_%%%"])
def test_a_call_webhook_secret_that_is_not_whsec_base64_stops_the_start(bad: str) -> None:
    from gateway.settings import SettingsError, from_env

    with pytest.raises(SettingsError, match="OMNI_GATEWAY_CALL_WEBHOOK_SECRET"):
        from_env({"OMNI_GATEWAY_CALL_WEBHOOK_SECRET": bad})
    assert from_env({"OMNI_GATEWAY_CALL_WEBHOOK_SECRET": "whsec_YWJj"}).call_webhook_secret == "whsec_YWJj"


def test_the_callers_audio_is_put_back_in_order() -> None:
    from gateway.transport.telephony.reorder import Reorder

    r = Reorder(window=2)
    assert r.push(2, b"2") == []  # (the count starts at 1: 2 waits for it)
    assert r.push(1, b"1") == [b"1", b"2"]
    r = Reorder(window=2, first=None)
    assert r.push(1, b"1") == [b"1"]
    assert r.push(3, b"3") == []  # 2 is missing: held
    assert r.push(2, b"2") == [b"2", b"3"]
    assert r.push(2, b"2") == [] and r.dropped == 1  # a repeat
    assert r.push(5, b"5") == [] and r.push(6, b"6") == []
    assert r.push(7, b"7") == [b"5", b"6", b"7"] and r.skipped == 1  # 4 never came: skipped past the window
    assert r.push(4, b"4") == [] and r.dropped == 2  # too late
    assert r.push(None, b"x") == [b"x"]  # (a carrier that does not number its audio)


def test_plivo_and_telnyx_messages_decode_as_their_documents_show_them() -> None:
    from gateway.protocol.telephony import PLIVO, TELNYX

    start = PLIVO.decode(orjson.dumps({"event": "start", "sequenceNumber": 1, "start": {
        "callId": "c1", "streamId": "s1", "accountId": "MA1", "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000}},
        "extra_headers": "userId=12345;sessionId=abc"}))  # fmt: skip
    assert isinstance(start, StreamStart) and (start.stream_id, start.call_id) == ("s1", "c1")
    assert start.parameters == {"userId": "12345", "sessionId": "abc"}
    assert PLIVO.decode('{"event":"playedStream","streamId":"s1","name":"4"}') == MarkIn("4")
    assert PLIVO.decode('{"event":"clearedAudio","streamId":"s1"}') is None
    assert orjson.loads(PLIVO.mark("s1", "4")) == {"event": "checkpoint", "streamId": "s1", "name": "4"}
    assert orjson.loads(PLIVO.clear("s1")) == {"event": "clearAudio", "streamId": "s1"}
    assert start.audio == PCMU_8K
    assert orjson.loads(PLIVO.media("s1", b"\x01", PCMU_8K)) == {"event": "playAudio", "media": {
        "contentType": "audio/x-mulaw", "sampleRate": 8000, "payload": base64.b64encode(b"\x01").decode()}}  # fmt: skip
    start = TELNYX.decode(orjson.dumps({"event": "start", "sequence_number": "1", "stream_id": "st", "start": {
        "call_control_id": "v3:x", "custom_parameters": {"client_secret": "ek_1"},
        "media_format": {"encoding": "PCMA", "sample_rate": 8000, "channels": 1}}}))  # fmt: skip
    assert isinstance(start, StreamStart) and start.audio.codec == "pcma" and start.stream_id == "st"
    assert orjson.loads(TELNYX.clear("st")) == {"event": "clear"}


@pytest.mark.parametrize("rate", [8000, 16000])
def test_a_plivo_l16_stream_is_linear_pcm_both_ways(rate: int) -> None:
    """``contentType="audio/x-l16;rate=..."``: the start's mediaFormat says it, the caller's audio is
    base64 PCM16 little-endian at that rate, and ``playAudio`` names the same format."""
    from gateway.protocol.telephony import L16_8K, L16_16K, PLIVO

    start = PLIVO.decode(orjson.dumps({"event": "start", "sequenceNumber": 0, "start": {
        "callId": "c1", "streamId": "s1", "accountId": "MA1", "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": rate}}, "extra_headers": "{}"}))  # fmt: skip
    assert isinstance(start, StreamStart) and start.audio == {8000: L16_8K, 16000: L16_16K}[rate]
    samples = b"\x01\x00\xff\x7f" * (rate // 100)  # 20 ms of PCM16 (little-endian: 1, 32767, ...)
    media = PLIVO.decode(orjson.dumps({"event": "media", "sequenceNumber": 2, "streamId": "s1", "media": {
        "track": "inbound", "timestamp": "1700000000000", "chunk": 1,
        "payload": base64.b64encode(samples).decode()}}))  # fmt: skip
    assert media == MediaIn(samples, 1)
    assert orjson.loads(PLIVO.media("s1", samples, start.audio)) == {"event": "playAudio", "media": {
        "contentType": "audio/x-l16", "sampleRate": rate, "payload": base64.b64encode(samples).decode()}}  # fmt: skip


@pytest.mark.parametrize("encoding, rate", [("audio/x-l16", 24000), ("audio/x-l16", 44100), ("audio/x-mulaw", 16000),
                                            ("audio/x-alaw", 8000), ("audio/l16", 16000), (None, 8000)])  # fmt: skip
def test_a_plivo_start_in_another_format_is_refused_naming_what_is_taken(encoding: str | None, rate: int) -> None:
    from gateway.protocol.telephony import PLIVO

    message = orjson.dumps({"event": "start", "start": {"callId": "c", "streamId": "s", "mediaFormat": {
        "encoding": encoding, "sampleRate": rate}}})  # fmt: skip
    with pytest.raises(CarrierMessageError, match="only audio/x-mulaw at 8000 Hz or audio/x-l16 at 8000 or 16000 Hz"):
        PLIVO.decode(message)


def test_vonage_messages_decode_as_its_documents_show_them() -> None:
    from gateway.protocol.telephony import L16_8K, L16_16K, VONAGE, Binary

    start = VONAGE.decode('{"event":"websocket:connected","content-type":"audio/l16;rate=16000",'
                          '"client_secret":"ek_1","uuid":"u-1","language":"en-GB","n":3}')  # fmt: skip
    assert isinstance(start, StreamStart) and start.audio == L16_16K and start.call_id == "u-1"
    assert start.parameters == {"client_secret": "ek_1", "uuid": "u-1", "language": "en-GB"}  # (strings only)
    start = VONAGE.decode('{"event":"websocket:connected","content-type":"audio/l16;rate=8000"}')
    assert isinstance(start, StreamStart) and start.audio == L16_8K
    assert VONAGE.decode(b"\x01\x00" * 320) == MediaIn(b"\x01\x00" * 320, None)  # a binary message: audio
    assert VONAGE.decode('{"event":"websocket:dtmf","digit":"7","duration":260}') == DtmfIn("7")
    assert VONAGE.decode('{"event":"websocket:notify","payload":{"name":"12"}}') == MarkIn("12")
    assert VONAGE.decode('{"event":"websocket:cleared"}') is None
    assert VONAGE.media("", b"\x00\x01", L16_16K) == Binary(b"\x00\x01")
    assert orjson.loads(VONAGE.mark("", "3")) == {"action": "notify", "payload": {"name": "3"}}
    assert orjson.loads(VONAGE.clear("")) == {"action": "clear"}
    for bad in ('{"event":"websocket:connected","content-type":"audio/l16;rate=24000"}',
                '{"event":"websocket:connected","content-type":"audio/pcmu"}', b"\x00\x00\x00",
                '{"event":"websocket:dtmf","digit":"x"}', '{"event":"websocket:notify","payload":"3"}'):  # fmt: skip
        with pytest.raises(CarrierMessageError):
            VONAGE.decode(bad)
    assert VONAGE.signed("Bearer s3cret", [], "Bearer s3cret")
    assert not VONAGE.signed("Bearer s3cret", [], "Bearer other") and not VONAGE.signed("Bearer s3cret", [], None)


def test_exotel_messages_decode_as_its_documents_show_them() -> None:
    from gateway.protocol.telephony import EXOTEL, L16_8K, L16_16K

    start = EXOTEL.decode(orjson.dumps({"event": "start", "sequence_number": "1", "stream_sid": "MZ1", "start": {
        "stream_sid": "MZ1", "call_sid": "CA1", "account_sid": "AC1", "from": "+919876543210",
        "to": "+918047491899", "custom_parameters": {"client_secret": "ek_1"},
        "media_format": {"encoding": "audio/x-raw", "sample_rate": "8000", "bit_rate": "16"}}}))  # fmt: skip
    assert isinstance(start, StreamStart) and start.audio == L16_8K
    assert (start.stream_id, start.call_id, start.account_id) == ("MZ1", "CA1", "AC1")
    assert start.parameters == {"client_secret": "ek_1"}
    start = EXOTEL.decode('{"event":"start","start":{"call_sid":"c","stream_sid":"s","media_format":'
                          '{"encoding":"audio/x-raw","sample_rate":"16000","bit_rate":"16"}}}')  # fmt: skip
    assert isinstance(start, StreamStart) and start.audio == L16_16K
    payload = base64.b64encode(b"\x00\x01" * 800).decode()
    media = EXOTEL.decode(orjson.dumps({"event": "media", "sequence_number": "3", "stream_sid": "MZ1",
                                        "media": {"chunk": "2", "timestamp": "200", "payload": payload}}))  # fmt: skip
    assert media == MediaIn(b"\x00\x01" * 800, 2)
    assert EXOTEL.decode('{"event":"dtmf","stream_sid":"s","dtmf":{"digit":"5","duration":"100"}}') == DtmfIn("5")
    assert EXOTEL.decode('{"event":"mark","stream_sid":"s","mark":{"name":"9"}}') == MarkIn("9")
    assert isinstance(EXOTEL.decode('{"event":"connected"}'), Connected)
    assert isinstance(EXOTEL.decode('{"event":"stop","stop":{"call_sid":"c","reason":"callended"}}'), StreamStop)
    out = EXOTEL.media("MZ1", b"\x00\x01", L16_8K)
    payload = base64.b64encode(b"\x00\x01").decode()
    assert isinstance(out, bytes)
    assert orjson.loads(out) == {"event": "media", "stream_sid": "MZ1", "media": {"payload": payload}}
    assert orjson.loads(EXOTEL.mark("MZ1", "4")) == {"event": "mark", "stream_sid": "MZ1", "mark": {"name": "4"}}
    assert orjson.loads(EXOTEL.clear("MZ1")) == {"event": "clear", "stream_sid": "MZ1"}
    for encoding, bits in (("audio/x-raw", "8"), ("audio/x-mulaw", "8")):  # (μ-law: 800 bytes per 100 ms chunk,
        with pytest.raises(CarrierMessageError):  # not the multiple of 320 bytes Exotel asks for)
            EXOTEL.decode(orjson.dumps({"event": "start", "start": {"call_sid": "c", "media_format": {
                "encoding": encoding, "sample_rate": "8000", "bit_rate": bits}}}))  # fmt: skip
    auth = "Basic " + base64.b64encode(b"key:token").decode()
    assert EXOTEL.signed("key:token", [], auth) and not EXOTEL.signed("key:token", [], "Basic a2V5Om90aGVy")


def test_a_linear_pcm_carrier_is_a_linear_pcm_session() -> None:
    from gateway.protocol.telephony import L16_16K

    session = phone_session(None, L16_16K)
    assert session["audio"]["input"]["format"] == session["audio"]["output"]["format"] == {"type": "audio/pcm"}


async def test_the_answer_goes_to_a_carrier_in_its_whole_frames() -> None:
    """Vonage: one binary message per 20 ms (640 bytes at 16 kHz); Exotel: one message of whole
    20 ms (multiples of 320 bytes at 8 kHz); the end of an answer padded with silence."""
    from gateway.protocol.telephony import EXOTEL, L16_8K, L16_16K, TWILIO, VONAGE, Binary
    from gateway.transport.outbox import Outbox
    from gateway.transport.telephony.call import PhoneCall

    async def send(message: dict[str, object]) -> None:
        pass

    vonage = PhoneCall(VONAGE, "", "u-1", Outbox(send, 1 << 20, 5.0), L16_16K)
    frames = vonage._media(b"\x01\x02" * 1700)  # 106.25 ms
    assert [len(f.data) for f in frames if isinstance(f, Binary)] == [640] * 6
    assert frames[-1] == Binary(b"\x01\x02" * (1700 - 5 * 320) + b"\x00\x00" * (6 * 320 - 1700))
    exotel = PhoneCall(EXOTEL, "MZ1", "CA1", Outbox(send, 1 << 20, 5.0), L16_8K)
    (message,) = exotel._media(b"\x01\x02" * 850)
    assert isinstance(message, bytes)
    assert len(base64.b64decode(orjson.loads(message)["media"]["payload"])) == 1920  # 6 x 320
    twilio = PhoneCall(TWILIO, "MZ1", "CA1", Outbox(send, 1 << 20, 5.0), PCMU_8K)
    (message,) = twilio._media(b"\xff" * 801)
    assert isinstance(message, bytes) and len(base64.b64decode(orjson.loads(message)["media"]["payload"])) == 801


def test_a_vonage_upgrade_is_authorized_by_the_custom_value_or_a_fresh_jwt_under_the_secret() -> None:
    import time

    import jwt

    from gateway.protocol.telephony import VONAGE, VONAGE_JWT_MAX_AGE_S

    def token(key: str, iat: float, alg: str = "HS256") -> str:
        return "Bearer " + jwt.encode({"iat": int(iat), "jti": "j", "iss": "Vonage"}, key, algorithm=alg)

    now = time.time()
    secret = "a signature secret of 64 bytes or more (HS512 asks for as much) 0123456789"
    assert VONAGE.signed(secret, [], token(secret, now))
    assert VONAGE.signed(secret, [], token(secret, now - VONAGE_JWT_MAX_AGE_S + 30))
    assert not VONAGE.signed(secret, [], token(secret, now - VONAGE_JWT_MAX_AGE_S - 30))  # stale
    assert not VONAGE.signed(secret, [], token(secret, now + 3600))  # from the future
    assert not VONAGE.signed(secret, [], token("another signature secret, 32 bytes or more", now))
    assert not VONAGE.signed(secret, [], token(secret, now, "HS512"))  # (HS256 only)
    assert not VONAGE.signed(secret, [], "Bearer " + jwt.encode({"jti": "j"}, secret, algorithm="HS256"))
    assert not VONAGE.signed(secret, [], secret + "2") and not VONAGE.signed(secret, [], "Bearer " + secret)
