"""SIP digest authentication (RFC 3261 22, RFC 2617 with MD5 and qop=auth), Sans-I/O.

The gateway as a server (trunk credentials, ``sip_trunk_credentials``): ``Challenger``
makes stateless nonces (a timestamp and an HMAC of it under a key of the process, good for
``NONCE_TTL_S``) and checks an ``Authorization`` header against the credentials it holds.
The gateway as a client (an outbound call to a trunk that challenges it): ``answer`` writes
the header that answers a ``WWW-Authenticate``/``Proxy-Authenticate`` challenge.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping

NONCE_TTL_S = 300.0
_PARAM = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')


def _md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


def parse_params(header: str) -> dict[str, str]:
    """The parameters of a ``Digest ...`` header value (names lower-cased); {} if not Digest."""
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() != "digest":
        return {}
    return {m.group(1).lower(): m.group(2) if m.group(2) is not None else m.group(3) for m in _PARAM.finditer(rest)}


def response(*, username: str, password: str, realm: str, method: str, uri: str, nonce: str,
             qop: str | None = None, nc: str = "00000001", cnonce: str = "") -> str:  # fmt: skip
    ha1 = _md5(f"{username}:{realm}:{password}")
    ha2 = _md5(f"{method}:{uri}")
    if qop:
        return _md5(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")
    return _md5(f"{ha1}:{nonce}:{ha2}")


def answer(challenge: str, *, username: str, password: str, method: str, uri: str) -> str | None:
    """The ``Authorization`` value answering ``challenge`` (None: not an MD5 digest challenge)."""
    params = parse_params(challenge)
    if not params or params.get("algorithm", "MD5").upper() != "MD5" or "nonce" not in params:
        return None
    realm = params.get("realm", "")
    qop = "auth" if "auth" in [q.strip() for q in params.get("qop", "").split(",")] else None
    cnonce = secrets.token_hex(8)
    digest = response(username=username, password=password, realm=realm, method=method, uri=uri,
                      nonce=params["nonce"], qop=qop, cnonce=cnonce)  # fmt: skip
    parts = [f'username="{username}"', f'realm="{realm}"', f'nonce="{params["nonce"]}"', f'uri="{uri}"',
             f'response="{digest}"', "algorithm=MD5"]  # fmt: skip
    if qop:
        parts += [f"qop={qop}", "nc=00000001", f'cnonce="{cnonce}"']
    if "opaque" in params:
        parts.append(f'opaque="{params["opaque"]}"')
    return "Digest " + ", ".join(parts)


class Challenger:
    """Challenges requests and checks their answers against ``credentials`` (user -> password)."""

    def __init__(self, credentials: Mapping[str, str], realm: str = "omni-gateway",
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.credentials = dict(credentials)
        self.realm = realm
        self._key = secrets.token_bytes(32)
        self._clock = clock

    def _sign(self, stamp: str) -> str:
        return hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:32]

    def challenge(self) -> str:
        """A ``WWW-Authenticate`` value with a fresh nonce."""
        stamp = f"{self._clock():.0f}"
        return f'Digest realm="{self.realm}", nonce="{stamp}.{self._sign(stamp)}", algorithm=MD5, qop="auth"'

    def check(self, authorization: str | None, method: str) -> bool:
        """Whether ``authorization`` answers one of our nonces, still fresh, with a user's password."""
        if not authorization:
            return False
        params = parse_params(authorization)
        nonce = params.get("nonce", "")
        stamp, _, mac = nonce.partition(".")
        if not stamp.isdigit() or not hmac.compare_digest(mac, self._sign(stamp)):
            return False
        if self._clock() - int(stamp) > NONCE_TTL_S:
            return False
        password = self.credentials.get(params.get("username", ""))
        if password is None or params.get("realm") != self.realm:
            return False
        expected = response(username=params["username"], password=password, realm=self.realm, method=method,
                            uri=params.get("uri", ""), nonce=nonce, qop=params.get("qop"),
                            nc=params.get("nc", ""), cnonce=params.get("cnonce", ""))  # fmt: skip
        return hmac.compare_digest(expected, params.get("response", ""))
