"""SIP messages (RFC 3261 section 7), Sans-I/O: parse one from bytes, serialize one to bytes.

Only what a user agent server needs: the start line, headers (compact forms expanded, names
kept in their canonical spelling, several values of one name kept in order) and the body. A
datagram is one message; a TCP stream is cut into messages by ``StreamFramer`` (the
``Content-Length`` every stream message must carry). Anything malformed raises
``SipParseError``: the server answers it 400 where it can tell whom to answer, else drops it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 16 * 1024  # a larger message is refused (a datagram: dropped; a stream: closed)
MAX_HEADERS = 64  # more header lines in one message: refused as malformed
_COMPACT = {
    "i": "Call-ID", "m": "Contact", "e": "Content-Encoding", "l": "Content-Length", "c": "Content-Type",
    "f": "From", "s": "Subject", "k": "Supported", "t": "To", "v": "Via",
}  # fmt: skip
_CANONICAL = {
    name.lower(): name
    for name in (
        "Via", "From", "To", "Call-ID", "CSeq", "Contact", "Max-Forwards", "Content-Type", "Content-Length",
        "User-Agent", "Server", "Allow", "Supported", "Record-Route", "Route", "Refer-To", "Referred-By",
        "Reason", "Retry-After", "Expires", "Session-Expires", "Require", "Unsupported", "Warning", "Accept",
        "WWW-Authenticate", "Proxy-Authenticate", "Authorization", "Proxy-Authorization", "Event",
        "Subscription-State",
    )
}  # fmt: skip
_TAG = re.compile(r";\s*tag=([^;>\s]+)", re.IGNORECASE)


class SipParseError(ValueError):
    """Not a SIP message this server can read."""


def canonical(name: str) -> str:
    low = name.strip().lower()
    if len(low) == 1 and low in _COMPACT:
        return _COMPACT[low]
    return _CANONICAL.get(low, "-".join(part.capitalize() for part in low.split("-")))


@dataclass
class SipMessage:
    """A request (``method`` and ``uri`` set) or a response (``status`` and ``reason`` set)."""

    method: str | None = None
    uri: str | None = None
    status: int | None = None
    reason: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return self.method is not None

    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (any spelling), or None."""
        want = canonical(name)
        return next((v for n, v in self.headers if n == want), None)

    def get_all(self, name: str) -> list[str]:
        want = canonical(name)
        return [v for n, v in self.headers if n == want]

    def set(self, name: str, value: str) -> None:
        """Replace every value of ``name`` with ``value`` (at the first one's place, else last)."""
        want = canonical(name)
        out: list[tuple[str, str]] = []
        placed = False
        for n, v in self.headers:
            if n == want:
                if not placed:
                    out.append((want, value))
                    placed = True
            else:
                out.append((n, v))
        if not placed:
            out.append((want, value))
        self.headers = out

    def add(self, name: str, value: str) -> None:
        self.headers.append((canonical(name), value))

    @property
    def call_id(self) -> str:
        return self.get("Call-ID") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        """(number, method) of the CSeq header; raises SipParseError when absent or malformed."""
        raw = self.get("CSeq")
        parts = raw.split() if raw else []
        if len(parts) != 2 or not parts[0].isdigit():
            raise SipParseError("bad CSeq")
        return int(parts[0]), parts[1].upper()

    @property
    def branch(self) -> str:
        """The top Via's branch (the transaction's key), '' if none."""
        via = self.get("Via") or ""
        match = re.search(r";\s*branch=([^;,\s]+)", via, re.IGNORECASE)
        return match.group(1) if match else ""

    def encode(self) -> bytes:
        if self.is_request:
            start = f"{self.method} {self.uri} SIP/2.0"
        else:
            start = f"SIP/2.0 {self.status} {self.reason}"
        lines = [start]
        lines += [f"{n}: {v}" for n, v in self.headers if n != "Content-Length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + self.body


def tag_of(value: str | None) -> str | None:
    """The ``tag`` parameter of a From or To header value."""
    if not value:
        return None
    match = _TAG.search(value)
    return match.group(1) if match else None


def uri_of(value: str) -> str:
    """The URI of a name-addr (``"Bob" <sip:bob@host>;tag=x``) or addr-spec header value."""
    if "<" in value and ">" in value:
        return value[value.index("<") + 1 : value.index(">")]
    return value.split(";", 1)[0].strip()


def parse(data: bytes) -> SipMessage:
    """One whole message (a datagram, or what ``StreamFramer`` cut)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError("message too large")
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = data.partition(b"\n\n")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("headers are not UTF-8") from None
    lines = text.replace("\r\n", "\n").split("\n")
    start = lines[0].strip()
    msg = SipMessage()
    if start.startswith("SIP/2.0 "):
        parts = start.split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit() or len(parts[1]) != 3:
            raise SipParseError("bad status line")
        msg.status, msg.reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
    else:
        parts = start.split(" ")
        if len(parts) != 3 or parts[2] != "SIP/2.0" or not parts[0].isalpha() or not parts[1]:
            raise SipParseError("bad request line")
        msg.method, msg.uri = parts[0].upper(), parts[1]
    unfolded: list[str] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[0] in " \t" and unfolded:  # a folded continuation line
            unfolded[-1] += " " + line.strip()
        else:
            unfolded.append(line)
    if len(unfolded) > MAX_HEADERS:
        raise SipParseError("too many headers")
    for line in unfolded:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise SipParseError("bad header line")
        canon = canonical(name)
        value = value.strip()
        if canon in ("Via", "Contact", "Record-Route", "Route") and "," in value and canon != "Contact":
            for piece in _split_commas(value):  # several values in one line: kept as separate headers
                msg.headers.append((canon, piece))
        else:
            msg.headers.append((canon, value))
    length = msg.get("Content-Length")
    if length is not None:
        if not length.strip().isdigit():
            raise SipParseError("bad Content-Length")
        n = int(length)
        if n > len(body):
            raise SipParseError("body shorter than Content-Length")
        body = body[:n]
    msg.body = body
    for required in ("Via", "From", "To", "Call-ID", "CSeq"):
        if msg.get(required) is None:
            raise SipParseError(f"no {required} header")
    msg.cseq  # noqa: B018 - validated here, once
    return msg


def _split_commas(value: str) -> list[str]:
    out: list[str] = []
    cur: list[str] = []
    depth, quoted = 0, False
    for ch in value:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "<":
            depth += 1
        elif not quoted and ch == ">":
            depth -= 1
        if ch == "," and depth == 0 and not quoted:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [p for p in out if p]


class StreamFramer:
    """A TCP byte stream in, whole messages out (each must carry ``Content-Length``)."""

    def __init__(self, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Whole messages now available; raises SipParseError when the stream is not SIP."""
        self._buf += data
        out: list[bytes] = []
        while True:
            while self._buf[:2] == b"\r\n":  # keep-alive CRLFs between messages (RFC 5626)
                del self._buf[:2]
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > self.max_bytes:
                    raise SipParseError("header too large")
                return out
            head = bytes(self._buf[:end]).decode("utf-8", "replace")
            match = re.search(r"^(?:content-length|l)\s*:\s*(\d+)\s*$", head, re.IGNORECASE | re.MULTILINE)
            if match is None:
                raise SipParseError("a stream message needs Content-Length")
            total = end + 4 + int(match.group(1))
            if total > self.max_bytes:
                raise SipParseError("message too large")
            if len(self._buf) < total:
                return out
            out.append(bytes(self._buf[:total]))
            del self._buf[:total]


def response_to(request: SipMessage, status: int, reason: str, *, to_tag: str | None = None) -> SipMessage:
    """A response to ``request`` (RFC 3261 8.2.6): Via, From, To (with ``to_tag`` added when it
    has none), Call-ID and CSeq copied."""
    resp = SipMessage(status=status, reason=reason)
    for name in ("Via", "Record-Route"):
        for value in request.get_all(name):
            resp.add(name, value)
    resp.add("From", request.get("From") or "")
    to = request.get("To") or ""
    if to_tag is not None and tag_of(to) is None and status != 100:
        to = f"{to};tag={to_tag}"
    resp.add("To", to)
    resp.add("Call-ID", request.call_id)
    resp.add("CSeq", request.get("CSeq") or "")
    return resp
