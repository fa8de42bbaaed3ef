"""What a call that plays the answers itself keeps of them (a WebRTC call's track, a SIP
call's RTP, a carrier's stream), written once for the three.

Each answer's output format (its ``response.created``: a ``response.create`` may set its own),
the item its audio plays, and its converter from the engine's own audio to the call's
(``audio.convert.OutputConverters``: one conversion). A GPT-Live answer names no response:
its deltas and its end (a ``response.done`` naming none, ``session/events.py``'s
``MediaEvent``) are one stream of speech per answer, a new one after each end and each cut.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from gateway.audio.codecs import AudioFormat
from gateway.audio.convert import OutputConverters
from gateway.protocol.session_config import parse_ga_format

KEEP = 16  # answers whose format, item and converter are kept (older ones are forgotten first)


class AnswerAudio:
    def __init__(self, dst: AudioFormat, default: AudioFormat) -> None:
        """``dst``: what the call plays."""
        self.default = default  # an answer's format when neither it nor its session says one
        self._out = OutputConverters(dst, keep=KEEP)
        self._formats: OrderedDict[str, AudioFormat] = OrderedDict()  # response id -> its output format
        self._items: OrderedDict[str, str] = OrderedDict()  # response id -> the item its audio plays
        self._speech = 0  # GPT-Live's speech stream now playing

    def created(self, response: dict[str, Any]) -> None:
        """A ``response.created``: its output format, where it has one (else the session's)."""
        try:
            fmt = parse_ga_format(response["audio"]["output"]["format"], "response.audio.output.format")
        except Exception:  # a beta-shaped or partial response: the session's format applies
            return
        _keep(self._formats, response["id"], fmt)

    def delta(self, event: dict[str, Any], session_format: AudioFormat | None) -> tuple[str, str, bytes]:
        """An audio delta (in its answer's format, else ``session_format``, else the default):
        its response id, its item id and its audio in the call's format."""
        response_id = event.get("response_id") or f"speech{self._speech}"
        fmt = self._formats.get(response_id) or session_format or self.default
        item_id = event.get("item_id") or ""
        audio = self._out.convert(response_id, bytes(event["delta"]), fmt, event)
        if response_id not in self._items:
            _keep(self._items, response_id, item_id)
        return response_id, item_id, audio

    def ended(self, response: dict[str, Any]) -> tuple[str, str | None, bytes]:
        """An answer's ``response.done``: its response id, its item (None: none of its audio
        came) and what its converter still held, in the call's format."""
        response_id = response.get("id")
        if response_id is None:  # GPT-Live's answer (its end names none, as its deltas)
            response_id = f"speech{self._speech}"
            self._speech += 1
        return response_id, self._items.pop(response_id, None), self._out.end(response_id)

    def cut(self) -> None:
        """The call's audio was cut: GPT-Live's next speech is a new stream (what was cut stays
        cut: audio of it still on its way is dropped by the player)."""
        self._speech += 1

    def clear(self) -> None:
        """The call is over: every converter goes."""
        self._out.clear()


def _keep(kept: OrderedDict[str, Any], key: str, value: Any) -> None:
    kept[key] = value
    while len(kept) > KEEP:
        kept.popitem(last=False)
