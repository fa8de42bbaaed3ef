"""Which web pages may open a WebSocket to the gateway: the ``Origin`` check.

A browser sends ``Origin`` (the page's scheme, host and port) with every
WebSocket upgrade and lets any page open a socket to any host; the server is
the only one that can say no. Non-browser clients (SDKs, servers) send none.

- **No ``Origin``**: allowed (a non-browser client; it proves itself with its
  credential like any other).
- **``allowed_origins`` set** (``https://app.example.com``, ``https://*.example.com``
  for any subdomain, ``*`` for every page): those origins, plus the gateway's
  own pages (same origin) when auth is required. A port is part of an origin,
  for wildcards as for exact entries: ``https://*.example.com`` admits
  subdomains on the default port (443) only, ``https://*.example.com:8443`` on
  8443 only.
- **unset** (the default): pages on this machine (``localhost``, ``*.localhost``,
  ``127.0.0.0/8``, ``[::1]``, any port) and, when auth is required, the
  gateway's own pages. Without auth (loopback, no keys) only loopback pages:
  a page elsewhere on the web, or one that reaches a loopback gateway through
  a DNS name it controls (DNS rebinding), is refused.

A refused origin is answered at the upgrade: HTTP 403, ``origin_not_allowed``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

ANY = "*"


def _host_of(netloc: str) -> str:
    """The host part of ``host[:port]`` or ``[v6]:port``, lower-cased."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")] if "]" in netloc else netloc
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


def is_loopback_host(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split_port(netloc: str) -> tuple[str, str]:
    """(host, port) of a normalized netloc; the port is "" when it is the scheme's default."""
    if netloc.startswith("["):
        host, _, rest = netloc.partition("]")
        return host + "]", rest.removeprefix(":")
    host, _, port = netloc.partition(":")
    return host, port


def normalize(origin: str) -> str:
    """``scheme://host[:port]``, lower-cased, default ports dropped."""
    parts = urlsplit(origin.strip().lower())
    if not parts.scheme or not parts.netloc:
        return origin.strip().lower()
    netloc = parts.netloc
    default = {"http": ":80", "https": ":443", "ws": ":80", "wss": ":443"}.get(parts.scheme)
    if default and netloc.endswith(default):
        netloc = netloc[: -len(default)]
    return f"{parts.scheme}://{netloc}"


class OriginPolicy:
    def __init__(self, allowed: Iterable[str], *, auth_required: bool) -> None:
        entries = [e.strip() for e in allowed if e.strip()]
        self.any = ANY in entries
        self.exact = {normalize(e) for e in entries if "*" not in e}
        # "https://*.example.com" -> ("https", ".example.com", ""); with ":8443", port "8443"
        self.wildcards = [
            (scheme, host[1:], port) for e in entries if e != ANY for scheme, _, rest in [normalize(e).partition("://")]
            if rest.startswith("*.") for host, port in [_split_port(rest)]
        ]  # fmt: skip
        self.configured = bool(entries)
        self.auth_required = auth_required

    def allows(self, origin: str | None, host_header: str | None) -> bool:
        if origin is None:
            return True
        if self.any:
            return True
        norm = normalize(origin)
        parts = urlsplit(norm)
        host = _host_of(parts.netloc)
        if self.auth_required and host_header and norm == normalize(f"{parts.scheme}://{host_header}"):
            return True  # the gateway's own pages (the demo)
        if self.configured:
            if norm in self.exact:
                return True
            port = _split_port(parts.netloc)[1]
            return any(
                parts.scheme == scheme and host.endswith(suffix) and port == wanted
                for scheme, suffix, wanted in self.wildcards
            )
        return is_loopback_host(host)
