"""SDES-SRTP (RFC 4568 keys in the SDP, RFC 3711 packets), Sans-I/O.

The SDP side: ``parse_crypto`` reads one ``a=crypto:`` attribute, ``choose`` picks the first
an offer lists that the gateway takes, ``answer_key``/``offer_key`` make the gateway's own key
(fresh random bytes each call), and ``Crypto.attribute`` writes it back. The packet side:
``SrtpContext`` protects what the gateway sends with its own key and unprotects what the
caller sends with the caller's key (libsrtp through pylibsrtp, as aiortc's DTLS-SRTP does).

Taken: the suites ``AES_CM_128_HMAC_SHA1_80`` and ``AES_CM_128_HMAC_SHA1_32`` (a 128-bit AES
counter-mode key and a 112-bit salt, ``inline:`` base64 of the 30 bytes key||salt), one key
per attribute, with or without a lifetime (``|2^31``: read, not enforced; a call capped at
``sip_max_call_s`` sends 50 packets a second, and no key is ever renewed mid-call), the
window size hint ``WSH=`` (ignored: libsrtp's replay window is 128 packets). Not taken (the
attribute is skipped, as RFC 4568 6.1 says the answerer does; none left: 488): other suites
(the AES-256, AEAD-GCM and F8 ones), a key with an MKI (``|1:4``), several keys in one
attribute, and the session parameters that weaken or change the protection
(``UNENCRYPTED_SRTP``, ``UNENCRYPTED_SRTCP``, ``UNAUTHENTICATED_SRTP``, ``KDR=`` other than
0, ``FEC_ORDER=``, ``FEC_KEY=``).
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass

SUITES = {  # RFC 4568's name -> pylibsrtp's profile (imported where a call is protected: the webrtc extra)
    "AES_CM_128_HMAC_SHA1_80": "SRTP_PROFILE_AES128_CM_SHA1_80",
    "AES_CM_128_HMAC_SHA1_32": "SRTP_PROFILE_AES128_CM_SHA1_32",
}
OFFERED_SUITE = "AES_CM_128_HMAC_SHA1_80"  # what an outbound call offers (every SDES trunk takes it)
KEY_BYTES = 30  # 16 bytes of AES key, 14 of salt
_LIFETIME = re.compile(r"^(?:2\^\d{1,2}|\d{1,20})$")
_UNSHOWN = re.compile(r"[^A-Za-z0-9_=:./^+-]")


def shown(text: str) -> str:
    """The caller's text as a refusal quotes it (in a Warning header): short, no quotes."""
    return _UNSHOWN.sub("?", text[:40])


class CryptoError(ValueError):
    """An ``a=crypto`` attribute the gateway does not take (why, for the 488's Warning)."""


@dataclass(frozen=True, slots=True)
class Crypto:
    """One ``a=crypto`` attribute: its tag, suite and master key||salt."""

    tag: int
    suite: str
    key: bytes

    def attribute(self) -> str:
        """The ``a=crypto:`` line's value (without ``a=``)."""
        return f"crypto:{self.tag} {self.suite} inline:{base64.b64encode(self.key).decode()}"


def parse_crypto(value: str) -> Crypto:
    """The value after ``a=crypto:``. Raises CryptoError saying what is not taken."""
    parts = value.split()
    if len(parts) < 3 or not parts[0].isdigit() or len(parts[0]) > 9:
        raise CryptoError("a malformed a=crypto attribute")
    tag, suite, key_params, session_params = int(parts[0]), parts[1], parts[2], parts[3:]
    if suite not in SUITES:
        raise CryptoError(f"the crypto suite {shown(suite)} is not taken")
    if ";" in key_params:
        raise CryptoError("several keys in one a=crypto attribute are not taken")
    method, _, info = key_params.partition(":")
    if method != "inline":
        raise CryptoError(f"the key method {shown(method)} is not taken (inline only)")
    fields = info.split("|")
    if len(fields) > 3:
        raise CryptoError("a malformed a=crypto key")
    for extra in fields[1:]:
        if ":" in extra:
            raise CryptoError("a key with an MKI is not taken")
        if not _LIFETIME.match(extra):
            raise CryptoError("a malformed a=crypto key lifetime")
    try:
        key = base64.b64decode(fields[0], validate=True)
    except (binascii.Error, ValueError):
        raise CryptoError("the a=crypto key is not base64") from None
    if len(key) != KEY_BYTES:
        raise CryptoError(f"the a=crypto key is {len(key)} bytes, not {KEY_BYTES} (key and salt)")
    for param in session_params:
        name, _, arg = param.partition("=")
        if name == "WSH" or (name == "KDR" and arg == "0"):
            continue
        raise CryptoError(f"the SRTP session parameter {shown(name)} is not taken")
    return Crypto(tag, suite, key)


def choose(values: list[str]) -> Crypto:
    """The first of an offer's ``a=crypto`` values the gateway takes. Raises CryptoError (why
    the first one was not taken) when none is."""
    if not values:
        raise CryptoError("RTP/SAVP without an a=crypto attribute (SDES): DTLS-SRTP and other keying is not taken")
    first: CryptoError | None = None
    for value in values:
        try:
            return parse_crypto(value)
        except CryptoError as err:
            first = first or err
    assert first is not None
    raise CryptoError(f"no a=crypto the gateway takes ({first}; taken: {', '.join(SUITES)})")


def answer_key(offered: Crypto) -> Crypto:
    """The gateway's key for an answer: the offer's tag and suite, fresh key and salt."""
    return Crypto(offered.tag, offered.suite, secrets.token_bytes(KEY_BYTES))


def offer_key() -> Crypto:
    """The gateway's key for an outbound call's offer."""
    return Crypto(1, OFFERED_SUITE, secrets.token_bytes(KEY_BYTES))


def check_answer(offered: Crypto, answered: Crypto | None) -> None:
    """An outbound call's answer takes our offered SRTP (same tag and suite). Raises CryptoError."""
    if answered is None:
        raise CryptoError("the answer refused SRTP (RTP/AVP) though sip_outbound_srtp asks for it")
    if (answered.tag, answered.suite) != (offered.tag, offered.suite):
        raise CryptoError(f"the answer's a=crypto ({answered.tag} {answered.suite}) is not the one offered")


def _is_rtcp(packet: bytes) -> bool:
    return len(packet) >= 2 and 192 <= packet[1] <= 223  # RFC 5761 4: RTCP's packet types (SR, RR, ...)


class SrtpContext:
    """One call's SRTP: ``local`` protects what the gateway sends, ``remote`` (the caller's key,
    the same suite) unprotects what it receives. Packets that fail are counted and dropped:
    ``auth_failures`` (a wrong authentication tag: a forged, corrupted or wrongly keyed packet),
    ``replays`` (one already received, or too old for the 128-packet window), ``rtcp`` (SRTCP:
    the gateway sends no RTCP and reads none)."""

    def __init__(self, local: Crypto, remote: Crypto) -> None:
        if local.suite != remote.suite:
            raise CryptoError("both directions of a call use one crypto suite")
        import pylibsrtp  # (beside aiortc: the webrtc extra, which the SIP media needs anyway)

        self.local = local
        self.remote = remote
        self._error = pylibsrtp.Error
        profile = getattr(pylibsrtp.Policy, SUITES[local.suite])
        out = pylibsrtp.Policy(key=local.key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_OUTBOUND, srtp_profile=profile)
        self._tx = pylibsrtp.Session(out)
        inbound = pylibsrtp.Policy(key=remote.key, ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND, srtp_profile=profile)
        self._rx = pylibsrtp.Session(inbound)
        self.auth_failures = 0
        self.replays = 0
        self.rtcp = 0
        self.other_failures = 0

    def protect(self, rtp: bytes) -> bytes:
        return self._tx.protect(rtp)

    def unprotect(self, srtp: bytes) -> bytes | None:
        """The RTP packet, or None: dropped (counted)."""
        if _is_rtcp(srtp):
            self.rtcp += 1
            return None
        try:
            return self._rx.unprotect(srtp)
        except (self._error, ValueError) as err:  # (ValueError: longer than libsrtp's 1500-byte buffer)
            reason = str(err)
            if reason.startswith("authentication"):
                self.auth_failures += 1
            elif reason.startswith("replay"):
                self.replays += 1
            else:
                self.other_failures += 1
            return None
