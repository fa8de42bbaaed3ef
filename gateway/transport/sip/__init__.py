"""SIP trunks straight to the gateway (``sip_port``): a SIP user agent server on UDP and TCP,
G.711 RTP paced on the wall clock, RFC 4733 DTMF. See docs/telephony-sip.md.

Sans-I/O cores (``message``, ``sdp``, ``rtp``, ``guard``) with thin asyncio shells
(``server``, ``media``); a call reaches its session through a hosting ``Door`` (``call``).
"""
