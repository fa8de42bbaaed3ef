"""Hostile client input, generated from a seed: what an attacker sends a realtime gateway.

``Hostile(seed).next()`` returns one frame to send: a ``("text", str)``, a
``("binary", bytes)`` or a ``("raw_text", bytes)`` (a text frame whose bytes
are not UTF-8, which no WebSocket library will send for you). The shapes:
every client event type with one field replaced by a wrong type or an extreme
value, fields dropped or added, nesting hundreds of levels deep, invalid
base64, oversize strings, huge conversations, non-JSON and non-object JSON,
and malformed binary audio frames. Valid seeds come from ``VALID``; every
frame is reproducible from (seed, index).
"""

from __future__ import annotations

import base64
import copy
import random
import re
from typing import Any

import orjson

Frame = tuple[str, Any]

_PCM = base64.b64encode(b"\x00\x01" * 480).decode()  # 20 ms at 24 kHz
_ITEM = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}

# One valid instance of every client event a realtime client may send (GA, beta and
# duplex spellings get added as the gateway learns them).
VALID: dict[str, dict[str, Any]] = {
    "session.update": {"session": {"type": "realtime", "instructions": "be brief", "output_modalities": ["text"]}},
    "input_audio_buffer.append": {"audio": _PCM},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "conversation.item.create": {"item": _ITEM},
    "conversation.item.retrieve": {"item_id": "item_x"},
    "conversation.item.truncate": {"item_id": "item_x", "content_index": 0, "audio_end_ms": 10},
    "conversation.item.delete": {"item_id": "item_x"},
    "response.create": {"response": {"output_modalities": ["text"], "metadata": {"k": "v"}}},
    "response.cancel": {},
    "session.event_ack": {"last_received_server_event_seq": 1},
    "session.resume": {"session_id": "sess_x", "resume_token": "rt_x", "last_received_server_event_seq": 0},
}


def _raw_nested(depth: int, kind: str = "list") -> str:
    """Nesting as text: orjson refuses to *write* more than 254 levels, but a client sends bytes."""
    if kind == "list":
        return "[" * depth + "1" + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


_DEEP = re.compile(r'"@@deep:(\d+):(list|dict)@@"')
_RAW = re.compile(r'"@@raw:([^@"]*)@@"')


def _dumps(event: dict[str, Any]) -> str:
    """JSON text of ``event``, its markers replaced by what orjson will not write: nesting
    that deep (``@@deep:N:list@@``), or raw number text (``@@raw:1e999@@``)."""
    text = orjson.dumps(event).decode()
    text = _DEEP.sub(lambda m: _raw_nested(int(m.group(1)), m.group(2)), text)
    return _RAW.sub(lambda m: m.group(1), text)


class Hostile:
    def __init__(self, seed: int, *, max_string: int = 200_000) -> None:
        self.rng = random.Random(seed)
        self.max_string = max_string
        self.count = 0

    # --- values -----------------------------------------------------------------

    def value(self) -> Any:
        r = self.rng
        choices: list[Any] = [
            None, True, False, 0, -1, -(2**63), 2**63 - 1, "@@raw:18446744073709551616@@", "@@raw:1e999@@",
            "@@raw:-0@@", "@@raw:1606938044258990275541962092341162602522202993782792835301376@@", 1e308, 0.5,
            "", "x", "é" * r.randint(1, 2000), "\u0000", "\ud7ff\ue000", "x" * r.randint(1, self.max_string),
            [], {}, [None] * r.randint(1, 500), {"type": "x"}, {str(i): i for i in range(r.randint(1, 300))},
            "!!!not base64!!!", "AAA", "====",
        ]  # fmt: skip
        if r.random() < 0.15:
            return f"@@deep:{r.choice([10, 100, 253, 254, 255, 330, 600, 1100])}:{r.choice(['list', 'dict'])}@@"
        return r.choice(choices)

    # --- frames -----------------------------------------------------------------

    def next(self) -> Frame:
        self.count += 1
        r = self.rng
        roll = r.random()
        if roll < 0.55:
            return "text", self._mutated()
        if roll < 0.65:
            return "text", self._deep_text()
        if roll < 0.72:
            return "text", self._not_an_event()
        if roll < 0.78:
            return "text", self._huge_item()
        if roll < 0.925:
            return "binary", self._binary()
        if roll < 0.93:  # rare: the gateway must fail the connection (RFC 6455 8.1), a new one follows
            return "raw_text", b'{"type": "\xff\xfe' + r.randbytes(r.randint(0, 40)) + b'"}'
        return "text", self._unknown()

    def _event(self) -> tuple[str, dict[str, Any]]:
        kind = self.rng.choice(sorted(VALID))
        event = {"type": kind, "event_id": f"evt_fuzz_{self.count}", **copy.deepcopy(VALID[kind])}
        return kind, event

    def _paths(self, obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        out = [prefix]
        if isinstance(obj, dict):
            for k, v in obj.items():
                out += self._paths(v, (*prefix, k))
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                out += self._paths(v, (*prefix, i))
        return out

    def _mutated(self) -> str:
        r = self.rng
        _, event = self._event()
        for _ in range(r.randint(1, 3)):
            paths = [p for p in self._paths(event) if p and (p[0] != "type" or r.random() < 0.05)]
            path = r.choice(paths or [("type",)])
            parent: Any = event
            for key in path[:-1]:
                parent = parent[key]
            op = r.random()
            if op < 0.7:
                parent[path[-1]] = self.value()
            elif op < 0.85 and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif isinstance(parent, dict):
                parent["unknown_" + str(r.randint(0, 99))] = self.value()
        return _dumps(event)

    def _deep_text(self) -> str:
        r = self.rng
        kind, _ = self._event()
        depth = r.choice([100, 253, 254, 255, 300, 330, 600, 1000, 1024, 1100, 5000])
        field = r.choice(["session", "response", "item", "metadata", "audio", "event_id", "tools"])
        return f'{{"type": "{kind}", "event_id": "evt_deep_{self.count}", "{field}": {_raw_nested(depth)}}}'

    def _not_an_event(self) -> str:
        r = self.rng
        return r.choice(["", "null", "[]", "42", '"type"', "{", '{"type":', "{}", '{"type": null}', '{"type": 7}',
                         "\ufeff{}", '{"type": "session.update"' + "," * 1000, "x" * r.randint(1, 5000)])  # fmt: skip

    def _huge_item(self) -> str:
        r = self.rng
        many = r.randint(100, 5000) if r.random() < 0.5 else r.randint(40, 64)  # over, or at, the parts bound
        parts = [{"type": "input_text", "text": "y" * r.randint(0, 2000)} for _ in range(many)]
        item = {"type": "message", "role": "user", "content": parts}
        event = {"type": "conversation.item.create", "event_id": f"evt_big_{self.count}", "item": item}
        return orjson.dumps(event).decode()

    def _binary(self) -> bytes:
        r = self.rng
        kind = r.random()
        if kind < 0.3:
            return b"\x01\x00\x00\x00" + r.randbytes(r.choice([1, 3, 959, 961]))  # odd: not whole samples
        if kind < 0.5:
            return bytes([r.randint(0, 255)]) + r.randbytes(r.randint(0, 100))  # unknown kinds
        if kind < 0.6:
            return b""
        return b"\x01\x00\x00\x00" + r.randbytes(2 * r.randint(0, 2400))  # valid audio, random samples

    def _unknown(self) -> str:
        r = self.rng
        name = r.choice(["session.delete", "x", "response.create.now", "input_audio_buffer", "🙂", "a" * 5000])
        return orjson.dumps({"type": name, "event_id": f"evt_unknown_{self.count}"}).decode()


# --- the driver: hostile sessions against a running gateway -------------------------------

DOCUMENTED_CLOSES = {1000, 1007, 1009, 4010}  # docs/errors.md's close-code table: what hostile input may earn


class FuzzStats:
    def __init__(self) -> None:
        self.inputs = 0
        self.errors_by_code: dict[str, int] = {}
        self.errors_without_code = 0
        self.closes: dict[int, int] = {}
        self.probes_sent = 0
        self.probes_answered = 0
        self.unanswered: list[str] = []
        self.sockets = 0
        self.unreadable: list[str] = []  # frames from the server a client could not parse

    def merge(self, other: FuzzStats) -> None:
        self.inputs += other.inputs
        self.errors_without_code += other.errors_without_code
        self.probes_sent += other.probes_sent
        self.probes_answered += other.probes_answered
        self.unanswered += other.unanswered
        self.sockets += other.sockets
        self.unreadable += other.unreadable
        for code, n in other.errors_by_code.items():
            self.errors_by_code[code] = self.errors_by_code.get(code, 0) + n
        for close, n in other.closes.items():
            self.closes[close] = self.closes.get(close, 0) + n

    @property
    def errors(self) -> int:
        return sum(self.errors_by_code.values())


async def fuzz_worker(port: int, seed: int, inputs: int, *, probe_every: int = 10, timeout: float = 10.0) -> FuzzStats:
    """``inputs`` hostile frames over as many sockets as it takes (a socket the gateway
    closes is replaced), a probe every ``probe_every``: a valid event that must be answered
    (``item_not_found`` echoing its id) within ``timeout`` s, in order with the rest."""
    import asyncio
    import struct

    from support.raw_ws import BINARY, CLOSE, PING, PONG, TEXT, frame, open_raw

    hostile = Hostile(seed)
    stats = FuzzStats()
    sent = 0
    while sent < inputs:
        client = await open_raw(port)
        stats.sockets += 1
        answered: set[str] = set()
        pending: list[str] = []
        closed = asyncio.Event()

        async def read(client: Any = client, answered: set[str] = answered, closed: asyncio.Event = closed) -> None:
            try:
                while True:
                    opcode, payload = await client.read_frame()
                    if opcode == CLOSE:
                        code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                        stats.closes[code] = stats.closes.get(code, 0) + 1
                        return
                    if opcode == PING:  # as any client does: else the keepalive closes a long socket (1011)
                        await client.send(frame(PONG, payload))
                        continue
                    if opcode != TEXT:
                        continue
                    event = orjson.loads(payload)
                    if event.get("type") != "error":
                        continue
                    error = event.get("error") or {}
                    code = error.get("code")
                    if not code:
                        stats.errors_without_code += 1
                        continue
                    stats.errors_by_code[code] = stats.errors_by_code.get(code, 0) + 1
                    if (error.get("event_id") or "").startswith("probe_"):
                        answered.add(error["event_id"])
            except (asyncio.IncompleteReadError, ConnectionError):
                stats.closes[1006] = stats.closes.get(1006, 0) + 1
            except Exception as exc:  # the server sent something a client cannot read
                stats.unreadable.append(repr(exc))
            finally:
                closed.set()

        reader = asyncio.get_running_loop().create_task(read())
        try:
            while sent < inputs and not closed.is_set():
                kind, data = hostile.next()
                sent += 1
                stats.inputs += 1
                if kind == "text":
                    wire = frame(TEXT, data.encode())
                elif kind == "raw_text":
                    wire = frame(TEXT, data)
                else:
                    wire = frame(BINARY, data)
                try:
                    await client.send(wire)
                    if sent % probe_every == 0:
                        probe = f"probe_{seed}_{sent}"
                        body = {"type": "conversation.item.retrieve", "item_id": probe, "event_id": probe}
                        await client.send(frame(TEXT, orjson.dumps(body)))
                        stats.probes_sent += 1
                        pending.append(probe)
                except ConnectionError:
                    break
                if kind == "raw_text":
                    await asyncio.wait_for(closed.wait(), timeout)  # the gateway must fail the connection
            if not closed.is_set():
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                while not set(pending) <= answered and loop.time() < deadline and not closed.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)  # polling: answers arrive on the reader task
        finally:
            stats.probes_answered += len(set(pending) & answered)
            if not closed.is_set():  # on a socket the gateway closed, later probes are owed nothing
                stats.unanswered += [p for p in pending if p not in answered]
            reader.cancel()
            client.abort()
    return stats
