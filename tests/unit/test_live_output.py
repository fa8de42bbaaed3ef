"""GPT-Live's paced output (``PacedOutput``, Sans-I/O, on a clock moved by hand): a client is
never sent more than the lead beyond what it has played, a barge-in drops the rest, and the
transcript goes out with the audio it speaks, never ahead of it."""

from __future__ import annotations

from gateway.audio.codecs import AudioFormat
from gateway.audio.pacing import LeadClock
from gateway.session.live_output import PacedOutput

FMT = AudioFormat("pcm16", 24000)  # 48 bytes a millisecond
MS = 48


def paced(lead_ms: int = 300) -> PacedOutput:
    return PacedOutput(lambda: FMT, lead_ms)


def audio_ms(out: list[tuple[str, str, bytes | str]]) -> float:
    return sum(len(v) for k, _, v in out if k == "audio" and isinstance(v, bytes)) / MS


def texts(out: list[tuple[str, str, bytes | str]]) -> str:
    return "".join(v for k, _, v in out if k == "text" and isinstance(v, str))


def test_the_lead_clock_lets_a_piece_go_only_within_the_lead() -> None:
    clock = LeadClock(300)
    assert clock.room(0.0, 100) and clock.wait_s(0.0, 100) == 0.0
    for _ in range(3):
        clock.sent(0.0, 100)
    assert abs(clock.ahead_ms(0.0) - 300) < 1e-6 and not clock.room(0.0, 100)
    assert abs(clock.wait_s(0.0, 100) - 0.1) < 1e-9  # once the ear has played 100 ms
    assert clock.room(0.1, 100) and clock.ahead_ms(0.5) == 0.0
    assert LeadClock(50).room(0.0, 400)  # longer than the lead: goes when nothing is ahead


def test_a_fast_engine_answer_goes_out_in_real_time_never_more_than_the_lead_ahead() -> None:
    out = paced()
    out.feed("r", bytes(10_000 * MS))  # ten seconds, made at once
    out.end("r")
    now, sent = 0.0, 0.0
    while out.queued:
        sent += audio_ms(out.due(now))
        played = now * 1000  # the client plays from time 0, at real time
        assert sent - played <= 300 + 1e-6  # never more than the lead ahead of its ear
        wait = out.wait_s(now)
        if wait is None:
            break
        assert wait > 0
        now += wait
    assert sent == 10_000 and 9.65 <= now <= 9.75  # the last piece goes the lead before the end


def test_small_engine_deltas_go_as_they_are_and_long_ones_in_pieces() -> None:
    out = paced()
    out.feed("r", bytes(20 * MS))
    out.feed("r", bytes(250 * MS))
    out.feed("r", bytes(100 * MS))
    sizes = [len(v) for k, _, v in out.due(0.0) if k == "audio"]
    assert sizes == [20 * MS, 100 * MS, 100 * MS, 50 * MS]  # 270 ms: the next 100 would pass the lead
    assert out.due(0.05) == []
    assert [len(v) for k, _, v in out.due(0.07) if k == "audio"] == [100 * MS]


def test_a_barge_in_drops_what_was_not_sent_and_its_transcript() -> None:
    out = paced()
    out.text("r", "one two three four five six seven eight nine ten ")
    out.feed("r", bytes(1000 * MS))
    out.end("r")
    first = out.due(0.0)
    assert audio_ms(first) == 300
    said = texts(first)
    assert said == "one two three "  # 30% of the audio: whole words of 30% of the text
    assert out.drop() == ["r"] and not out.queued
    assert out.due(10.0) == [] and out.end("r") == []
    out.feed("r", bytes(100 * MS))  # late audio of the dropped answer: refused
    out.text("r", "more")
    assert out.due(20.0) == [] and not out.queued
    out.feed("r2", bytes(100 * MS))  # the next answer goes out
    assert audio_ms(out.due(20.0)) == 100


def test_the_transcript_goes_with_its_audio_and_all_of_it_once_the_answer_is_out() -> None:
    out = paced()
    out.text("r", "Hello there. ")
    out.feed("r", bytes(200 * MS))
    out.text("r", "How are you?")
    out.feed("r", bytes(200 * MS))
    step = out.due(0.0)  # 300 ms: the first sentence's audio, half the second's
    assert [k for k, _, _ in step] == ["audio", "text", "audio", "text", "audio", "text"]
    assert texts(step) == "Hello there. How "
    assert out.end("r") == []  # its audio is not all out: the rest goes with it
    rest = out.due(1.0)
    assert texts(rest) == "are you?" and rest[-1] == ("end", "r", "")


def test_text_after_the_last_audio_goes_out_when_the_answer_ends() -> None:
    out = paced()
    out.feed("r", bytes(100 * MS))
    assert audio_ms(out.due(0.0)) == 100
    out.text("r", " bye")
    assert out.due(0.05) == []
    assert out.end("r") == [("text", "r", " bye"), ("end", "r", "")]
