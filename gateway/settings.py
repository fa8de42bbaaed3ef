"""Gateway settings: defaults, then ``OMNI_GATEWAY_*`` environment variables,
then command-line flags (highest). Every limit says what happens when hit.
"""

from __future__ import annotations

import base64
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

ENV_PREFIX = "OMNI_GATEWAY_"
ENGINES = ("cascade", "passthrough", "vllm", "omni", "remote")  # what ``engine`` may name
DEFAULT_MODEL = "omni-cascade"


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    # Which engine serves sessions: "cascade" (embedded CPU voice: silero VAD,
    # pocketsphinx, echo thinker, eSpeak NG), "passthrough" (benchmarks: no model),
    # "remote" (vLLM-Omni servers over their WebSocket protocols), "omni" (vLLM-Omni
    # in-process, GPU), "vllm" (vLLM AsyncLLM, text).
    engine: str = "cascade"
    model: str = DEFAULT_MODEL  # the default model: sessions that name none get it (for engine
    #   vllm/omni with engine_model and no model set: the checkpoint, as ``vllm serve`` names it)
    upstreams: tuple[str, ...] = ()  # engine/video_engine "remote": vLLM-Omni servers (or gateways),
    #   http(s):// or ws(s)://host:port; comma separated in the environment
    upstream_api_key: str | None = None  # sent upstream as Authorization: Bearer
    engine_model: str | None = None  # engine "omni"/"vllm" (or the vllm thinker): the checkpoint
    #   to load (default: ``model``)
    thinker: str = "echo"  # the cascade's text brain: "echo" (repeats what it heard) or "vllm"
    video_model: str | None = None  # the model /v1/realtime/video serves, by name: a session.start
    #   naming another is refused (model_not_found, as vLLM-Omni refuses it). video_engine "omni":
    #   the streaming diffusion checkpoint it loads; None for the others: "cpu-video" for cpu, and
    #   for remote none (the upstreams' model is not known here, so not matched)
    # Model routes (gateway/routing.py): inline JSON or a file path. None: ``model``
    # -> ``engine``, and OpenAI's realtime model names (gpt-realtime*, gpt-live*, ...) as
    # aliases of it; any other name is refused (model_not_found, close 4004).
    models: str | None = None
    redis_url: str | None = None  # None: in-process memory store
    api_keys: tuple[str, ...] = ()  # comma separated in the environment
    # Auth is required whenever the gateway binds beyond loopback or keys are set.
    # Starting on a non-loopback address with no keys is refused (see cli).
    auth_required: bool | None = None
    # With auth required, /metrics needs an operator credential (api_keys, or a keys-file
    # entry with "admin": true); true: anyone who reaches the port may scrape it.
    metrics_public: bool = False
    log_level: str = "info"
    # Gateway processes on one port (gateway/workers.py). None ("auto"): one per core this
    # process may use (CPU affinity and cgroup quota) when ``redis_url`` is set and no route
    # loads a model in-process (vllm, omni, the vllm thinker), else 1. More than 1 needs Redis:
    # the memory store lives in one process, so ``serve`` refuses to start without it.
    workers: int | None = None

    # --- browser-safe auth and tenants (docs/auth.md, docs/tenants.md) ---
    # Web pages that may open sockets (comma separated: "https://app.example.com",
    # "https://*.example.com", "*"). Unset: pages on this machine, and the gateway's own
    # pages when auth is required. Clients that send no Origin (non-browsers) always may.
    # A refused page gets HTTP 403 origin_not_allowed at the upgrade.
    allowed_origins: tuple[str, ...] = ()
    keys_file: str | None = None  # tenants (gateway/tenants.py): a JSON file or the JSON itself
    jwt_secret: str | None = None  # HS256 bearer tokens signed with this shared secret
    jwt_jwks: str | None = None  # RS256/ES256 bearer tokens: a JWKS file or http(s) URL
    jwt_issuer: str | None = None  # when set, a token's ``iss`` must be this
    jwt_audience: str | None = None  # when set, a token's ``aud`` must name this (unset: none allowed)
    jwt_leeway_s: float = 30.0  # clock skew allowed on ``exp``/``nbf``/``iat``
    jwks_refresh_s: float = 300.0  # a JWKS URL is fetched again this often (and for an unknown kid)
    jwt_jwks_allow_http: bool = False  # a plain http:// JWKS URL beyond loopback is refused at start
    #   (anyone on the path could swap the keys) unless this is true
    jwt_max_lifetime_s: float = 86_400.0  # a token whose exp - iat (exp - now without iat) is longer:
    #   refused, 401 saying so; 0: any lifetime
    # Default limits of every principal (a keys-file entry or a token's ``limits`` claim may
    # set its own); summed over all replicas; 0: no limit. What a client sees when hit: docs/tenants.md.
    tenant_max_sessions: int = 0  # sockets open at once; more: rate_limit_exceeded, close 4029
    tenant_session_starts_per_min: int = 0  # sockets opened in any 60 s; more: as above
    tenant_audio_in_s_per_min: float = 0.0  # input audio per clock minute; more: the append is dropped
    tenant_audio_out_s_per_min: float = 0.0  # output audio per clock minute; more: responses fail
    tenant_events_per_s: int = 0  # client messages per clock second; more: the message is dropped
    # Client secrets, bounded by default (each is stored until used or expired):
    tenant_max_secret_bytes: int = 65_536  # a mint's ``session`` as JSON; more: HTTP 400 client_secret_too_large
    tenant_max_secrets: int = 1_000  # secrets minted, not used, not expired; more: HTTP 429 rate_limit_exceeded
    tenant_secret_mints_per_min: int = 600  # mints in any 60 s; more: HTTP 429 rate_limit_exceeded
    # The session state the store keeps per principal (not 0 by default: the store is shared):
    tenant_max_state_mib: float = 1024.0  # its sessions' snapshots, items and journals, in MiB; past it
    #   kept sessions are forgotten for a new one, then new ones are refused (rate_limit_exceeded, 4029)
    tenant_max_kept_sessions: int = 1_000  # sessions kept resumable after their close; beyond: the
    #   oldest are forgotten (their resume: session_not_found)
    tenant_kept_session_ttl_s: float = 600.0  # a closed session's state is forgotten this long after
    #   its last use (at least 60 s, at most journal_ttl_s)

    # --- limits ---
    max_sessions: int = 2_000  # concurrent sessions per process; more: close 1013
    max_message_bytes: int = 15 << 20  # one client message (OpenAI's limit, 15 MiB); larger: error
    #   message_too_large, the message is dropped and the session goes on
    max_frame_bytes: int = 16 << 20  # hard transport limit; larger: close 1009 (uvicorn)
    max_append_ms: int = 300_000  # audio in one append (as much as the buffer holds, so that an append
    #   of up to max_message_bytes passes: 15 MiB of base64 PCM16 at 24 kHz is 246 s); more: error
    #   audio_append_too_large
    max_buffer_ms: int = 300_000  # uncommitted audio; more: error input_audio_buffer_full
    max_conversation_items: int = 1_000  # beyond: oldest items deleted (conversation.item.deleted)
    max_conversation_bytes: int = 4 << 20  # text, images and transcript marks of a session's conversation
    #   (each item counted as it changes); past it, the next item added deletes the oldest
    #   (conversation.item.deleted), as for max_conversation_items
    max_conversation_images: int = 32  # input_image parts in a session's conversation; past it, the next
    #   item added deletes the oldest, as above; one item (or a response's input) holding more: invalid_value
    max_conversation_image_pixels: int = 50_000_000  # the pixels those images declare in their headers,
    #   in all (an engine decodes them for each response: 150 MB as RGB); past it: as for the count.
    #   One image may declare at most 25,000,000 (5000 x 5000): more, invalid_value, never added
    session_lifetime_s: float = 3_600.0  # then error session_expired and close 4008
    outbound_queue_bytes: int = 16 << 20  # unsent bytes per socket; more: close 4010 slow_consumer
    outbound_stall_s: float = 10.0  # a send the socket has not taken for this long while more events
    #   come (the client stopped reading): close 4010 slow_consumer
    socket_send_buffer_bytes: int = 256 << 10  # the kernel's send buffer per realtime socket (SO_SNDBUF;
    #   0: the kernel's autotuning, up to 4 MiB): what a client that stops reading can hold unacked
    #   before outbound_stall_s starts counting; 2.5 s of base64 audio at 256 KiB
    max_transcriptions: int = 1_024  # running transcription requests per process
    max_responses: int = 256  # running response requests per process
    admission_timeout_s: float = 10.0  # wait for a slot; then the request fails with server_busy
    client_secret_ttl_s: int = 600  # default lifetime of a minted client secret (max 7200)
    header_timeout_s: float = 10.0  # a request head (an upgrade's too) not in within this, from the
    #   accept or its first byte: 408 request_timeout and the socket closes; 0: no timeout
    max_pending_connections: int = 512  # sockets not yet upgraded (reading a head, or idle between
    #   HTTP requests) per process; one more: 503 server_busy and closed at once, unread. Keep it well
    #   under the descriptor limit (ulimit -n); 0: no limit
    max_http_body_bytes: int = 1 << 20  # one HTTP request body (client secrets, video interactions,
    #   WebRTC offers), read as it streams in; larger: 413 request_body_too_large, the rest is never
    #   read and the connection is closed
    request_timeout_s: float = 30.0  # a whole HTTP request, head and body, from its first byte (a body
    #   is read only after its credential was checked); not in within this: 408 request_timeout and the
    #   socket closes (after a response began: just closed); 0: no timeout
    max_request_bodies: int = 64  # HTTP request bodies being read at once per process (each after its
    #   credential was checked; such a connection leaves max_pending_connections' count meanwhile); one
    #   more: 503 server_busy, unread, and the connection closes; 0: no limit

    # --- sessions that survive (resume) ---
    replica_id: str | None = None  # this process in the cluster; None: "<host>-<pid>-<random>"
    detach_grace_s: float = 60.0  # a session whose socket dropped keeps running here this long,
    #   then its requests are cancelled; it stays resumable from the store until journal_ttl_s
    lease_ttl_s: float = 15.0  # ownership lease, renewed every third of it; another replica
    #   may take a session over at any time (resume), the lease only tells who owns it
    journal_max_events: int = 10_000  # events kept per session; older ones are trimmed and a
    #   resume from before them gets session.resync_required
    journal_max_bytes: int = 4 << 20  # bytes kept per session (same effect as above; bounds
    #   the memory store at max_sessions x this)
    journal_ttl_s: float = 3_600.0  # a session idle this long is forgotten (resume: session_not_found)
    journal_flush_ms: float = 25.0  # journal batching: at most one commit per session per interval,
    #   every due session's in one store round trip (gateway/store/writer.py); a crash loses at
    #   most the events of the last interval and a grid step (interval / 4) from the journal
    journal_pending_max_bytes: int = 1 << 20  # events a session made that the store has not taken yet
    #   (Redis slow, down or frozen), kept in memory per session: past it the oldest are dropped and the
    #   journal told they are lost (a resume from before them gets session.resync_required)
    redis_timeout_s: float = 2.0  # a Redis reply slower than this fails its call, and Redis counts as down
    #   (a frozen Redis): every store call then fails at once, without waiting, until Redis answers
    #   again, as when it is dead (docs/sessions.md, "When Redis fails"); /readyz says 503 meanwhile
    redis_probe_interval_s: float = 1.0  # each replica asks Redis this often whether it answers and
    #   still holds its data (readiness; a Redis back empty: what this replica serves is written back)
    # --- video ---
    video_engine: str = "cpu"  # "cpu": frames rendered from the prompt (needs the video extra);
    #   "remote": the upstreams' /v1/realtime/video; "omni": vLLM-Omni in-process; "none"
    max_videos: int = 32  # running video streams per process; more wait, then server_busy
    video_queue_chunks: int = 8  # chunks waiting for a slow client; when full the oldest is dropped
    #   (reported in the next chunk's metadata)
    video_max_consecutive_drops: int = 24  # more chunks dropped in a row: close 4010 slow_consumer
    video_lead_chunks: int = 2  # generation runs at most this many chunks ahead of real time
    video_start_timeout_s: float = 10.0  # no session.start this long after the connect: error
    #   session_start_timeout, close 1000 (vLLM-Omni's start timeout)
    video_stall_timeout_s: float = 60.0  # no chunk produced and no session.ping this long while
    #   streaming: error stall_timeout, the stream is stopped, close 1000 (vLLM-Omni's stall report)
    video_interactions_per_s: int = 20  # interactions one stream takes in a second, from its socket and
    #   HTTP together (counted where it streams); more: error rate_limit_exceeded (HTTP 429), dropped; 0: none
    video_max_interaction_ids: int = 1_024  # event ids a stream remembers to refuse a reuse
    #   (event_id_conflict); older ones are forgotten (their reuse is taken). An event_id is at most 256
    #   characters (longer: string_above_max_length)

    # --- WebRTC calls (POST /v1/realtime/calls; the webrtc extra: gateway/transport/webrtc/) ---
    webrtc: bool = True  # answer WebRTC calls where aiortc is installed (false, or without it:
    #   POST /v1/realtime/calls answers 501 webrtc_unavailable)
    webrtc_ice_servers: str | None = None  # STUN/TURN servers: a JSON array of RTCIceServer objects, or
    #   comma-separated URLs (turn:user:credential@host:port); given to clients with every client
    #   secret and by GET /v1/realtime/calls/ice_servers; the gateway itself uses the first STUN and
    #   the first TURN of them (aioice takes no more)
    webrtc_udp_ports: str | None = None  # "40000-40199": media binds only there (open it in the
    #   firewall); None: any port. A port range the event loop cannot honour is dropped, with a warning
    webrtc_advertised_addresses: tuple[str, ...] = ()  # public IPs peers reach this replica at (NAT,
    #   containers: the node's address); comma separated in the environment
    webrtc_advertise_mode: str = "add"  # "add": the advertised addresses join the host candidates;
    #   "replace": they stand in for them (the host addresses are private); a loopback address advertised
    #   so (127.0.0.1) is gathered on directly: the media stays on loopback (what the tests run)
    webrtc_ice_timeout_s: float = 15.0  # an answered call not connected this long ends (ice_timeout)
    webrtc_peer_timeout_s: float = 10.0  # no packet at all from a connected peer this long: the call
    #   ends (peer_timeout); its session stays resumable for detach_grace_s
    webrtc_peer_networks: tuple[str, ...] = ("public",)  # where the gateway's ICE agent may send
    #   checks: "public" (globally routable addresses) and addresses or CIDR ranges, comma separated.
    #   An offer's candidate elsewhere (or on a port below 1024, or an mDNS name) is left out, never
    #   contacted; the peer still connects through its own checks (peer-reflexive candidates)
    sideband_relay_max_bytes: int = 1 << 20  # a call's sideband held by a replica that does not serve the
    #   call is relayed over the bus: a message it sends larger than this is refused there
    #   (message_too_large; the session goes on), an event larger than this reaches it in pieces, and at
    #   most this many bytes are in flight on the bus each way (the socket waits for room: TCP slows
    #   the backend). What waits for room on the call's replica beyond outbound_queue_bytes: 4010
    webrtc_max_offer_sections: int = 16  # m-lines in one offer, counted before it is parsed; more:
    #   400 offer_too_many_sections
    webrtc_max_offer_candidates: int = 64  # a=candidate lines in one offer, counted before it is
    #   parsed; more: 400 offer_too_many_candidates

    # --- phone calls through carriers' media streams (/v1/telephony/{carrier}; docs/telephony.md) ---
    twilio_auth_token: str | None = None  # the Twilio account's Auth Token: a stream's upgrade without
    #   an X-Twilio-Signature that signs it with this key is refused (HTTP 403 signature_invalid), before
    #   any audio. None: not checked (the client secret in the stream's parameters is still required)
    vonage_websocket_authorization: str | None = None  # the NCCO websocket endpoint's authorization: the
    #   value of type custom (the Authorization header, whole), or the account's signature secret for type
    #   vonage (Bearer and a JWT HS256 under it, issued at most 300 s before): an upgrade to
    #   /v1/telephony/vonage without either is refused (HTTP 403 signature_invalid). None: not checked
    #   (the client secret is still required)
    exotel_basic_auth: str | None = None  # KEY:TOKEN of the Exotel applet URL's Basic Auth: an upgrade to
    #   /v1/telephony/exotel without Authorization: Basic base64(KEY:TOKEN) is refused (HTTP 403
    #   signature_invalid). None: not checked (the client secret is still required)
    call_webhook_url: str | None = None  # an incoming stream without a client secret, and every SIP call,
    #   is announced here (POST realtime.call.incoming) and waits for /v1/realtime/calls/{call_id}/accept
    #   or /reject. None: such a stream is refused (close 4001); a SIP call is answered by sip_session
    call_webhook_secret: str | None = None  # "whsec_" + base64: the announcement is signed (Standard
    #   Webhooks: webhook-id, webhook-timestamp, webhook-signature); None: unsigned. Not base64: refused at start
    call_webhook_timeout_s: float = 10.0  # the announcement's POST, connect to answer; past it, or an answer
    #   other than 2xx: the call is refused (close 4001)
    call_accept_timeout_s: float = 30.0  # how long an announced call waits for accept or reject; past it the
    #   call is refused (close 4001) and a late accept or reject answers 404 call_id_not_found
    call_webhook_live: bool = False  # an announced call (SIP, or a carrier's stream) is also announced as
    #   GPT-Live's live.transport.incoming (session_id live_...): the first accept,
    #   /v1/realtime/calls/{call_id}/accept or /v1/live/sessions/{session_id}/accept, chooses the
    #   dialect; the other then answers 404

    # --- SIP trunks (gateway/transport/sip/; docs/telephony-sip.md; needs the webrtc extra's av) ---
    sip_port: int = 0  # SIP on UDP and TCP at ``host``:sip_port; 0: off (nothing listens)
    sip_tls_port: int = 0  # SIP over TLS at ``host``:sip_tls_port (with sip_port on); 0: none
    sip_tls_cert: str | None = None  # the operator's certificate chain (PEM file) for SIP over TLS
    sip_tls_key: str | None = None  # its private key (PEM file); either missing with sip_tls_port: no start
    sip_rtp_ports: str | None = None  # "20000-20199": a call's RTP binds an even port there (open it
    #   in the firewall); none free: the INVITE is answered 503. None: any free port
    sip_advertised_address: str | None = None  # the IP put in the SDP answer and the Contact (NAT,
    #   containers: the node's public address); None: the address SIP is bound to (``host``)
    sip_allowed_sources: tuple[str, ...] = ()  # trunk addresses (IPs or CIDR networks, comma separated)
    #   that may place calls; an INVITE from elsewhere: 403, other requests from there: dropped
    #   unanswered. Empty: loopback only
    sip_trunk_credentials: tuple[str, ...] = ()  # "user:password" entries (comma separated): an INVITE
    #   must then also answer a digest challenge (MD5, qop=auth) with one of them: without, or wrong,
    #   401 Unauthorized with a fresh challenge. Empty: the allow-list alone admits
    sip_invites_per_source_per_min: int = 60  # INVITEs from one address per minute (a token bucket);
    #   more: 503 with Retry-After; 0: no limit
    sip_invites_per_min: int = 600  # INVITEs from all addresses per minute; more: 503 with Retry-After;
    #   0: no limit
    sip_max_calls: int = 100  # calls ringing or answered at once on this replica; more: 486 Busy Here
    #   (max_sessions and draining answer 503 too)
    sip_ring_timeout_s: float = 30.0  # a call rings at most this long while call control decides;
    #   then 480 Temporarily Unavailable
    sip_max_call_s: float = 3600.0  # an answered call lasts at most this long: then the gateway sends
    #   BYE and its session ends; 0: no limit
    sip_session: str | None = None  # the default session a call is answered with when no webhook
    #   decides: a JSON object of session settings (as session.update takes); None: the model's defaults
    sip_model: str | None = None  # the model SIP sessions serve; None: ``model``
    sip_outbound_srtp: bool = False  # outbound calls offer SDES-SRTP (RTP/SAVP, AES_CM_128_HMAC_SHA1_80
    #   with a fresh key) and take only an SRTP answer: a trunk answering plain RTP is hung up (BYE) and
    #   the dial answers 502 (SIP 488). False: plain RTP offered. Inbound calls answer SRTP when offered

    # --- traces (OpenTelemetry, the ``otel`` extra; gateway/telemetry.py) ---
    otel_traces_endpoint: str | None = None  # OTLP/HTTP traces URL, e.g. http://collector:4318/v1/traces;
    #   None: tracing is off (OpenTelemetry is not even imported)
    otel_service_name: str = "omni-gateway"  # the traces' service.name
    otel_sample_ratio: float = 1.0  # the fraction of sessions traced (by trace id); a session not
    #   sampled costs what tracing off costs

    malloc_trim_s: float = 10.0  # glibc only (gateway/allocator.py): at start-up blocks of 128 KiB or
    #   more are set to be mapped apart (mallopt) and what is alive is frozen (gc.freeze); every this
    #   many seconds a full garbage collection (what closed connections held in reference cycles;
    #   its pause: omni_gc_pause_seconds) and free memory given back to the system (malloc_trim);
    #   0: none of it, glibc's allocator and CPython's collector are left as they are

    # --- MCP servers the gateway calls for sessions (gateway/hosting/mcp.py; the ``mcp`` extra) ---
    mcp_allowed_urls: tuple[str, ...] = ("*",)  # URLs a session's MCP tools may reach, as prefixes
    #   ("https://mcp.example.com/"), comma separated; "*": any URL whose host resolves only to public
    #   addresses (a loopback, private or link-local one is reached only where a prefix names it);
    #   empty: MCP off. Matched on the URL as requested (dot-segments resolved, scheme and host lower
    #   case, default port dropped; credentials, backslashes and encoded '.', '/' refused). Refused: the
    #   listing fails (mcp_list_tools.failed, error mcp_list_tools_failed)
    mcp_timeout_s: float = 30.0  # one listing or tool call, connect to answer; past it: it fails
    #   (mcp_list_tools.failed, or response.mcp_call.failed and the model hears why)
    mcp_max_result_bytes: int = 1 << 20  # what one listing or call may read from a server; more: the
    #   connection is dropped and it fails, as for a timeout
    mcp_max_listings: int = 32  # MCP listings running at once per process; one more waits for a place
    #   (at most mcp_timeout_s; then mcp_list_tools.failed, "listings are busy")
    mcp_max_listings_per_session: int = 4  # ... and per session (a session.update naming 128 servers
    #   lists 4 at a time); each listing is also one client event of its tenant's events_per_s

    # --- GPT-Live's Responses delegation (gateway/hosting/responses_backend.py; docs: "Delegation") ---
    live_responses_url: str | None = None  # an OpenAI-compatible API's base URL (http://host:8000/v1,
    #   as vllm serve answers it): a Live session with delegation "responses" runs its tasks there
    #   (POST {url}/responses, stream: true). None: such a session is refused at session.start
    #   (responses_backend_unconfigured)
    live_responses_api_key: str | None = None  # sent to it as Authorization: Bearer (never logged)
    live_responses_timeout_s: float = 60.0  # connecting, and each wait for the next byte of its
    #   answer; past it the request is dropped: error responses_backend_timeout
    live_responses_max_event_bytes: int = 1 << 20  # one server-sent event of its stream; larger: the
    #   request is dropped, error responses_backend_invalid
    live_output_lead_ms: int = 300  # a Live session on a WebSocket sends the model's audio in real time,
    #   at most this far ahead of the client's playback: a barge-in drops the rest, so the client plays at
    #   most this much of an interrupted answer. 0: not paced (sent as the engine makes it). Set before a
    #   session starts; a session resumed keeps its own (docs/live.md, "Paced output")

    drain_window_s: float = 20.0  # SIGTERM: each session is handed over (its sockets closed with 1012:
    #   reconnect and resume elsewhere) at its first idle moment, paced; at the end of this window every
    #   session left is handed over as it is (a running answer: re-issued where it resumes)

    @property
    def requires_auth(self) -> bool:
        if self.auth_required is not None:
            return self.auth_required
        return self.has_credentials or not is_loopback(self.host)

    @property
    def has_credentials(self) -> bool:
        """Some way to authenticate is configured: keys, a keys file or a token issuer."""
        return bool(self.api_keys or self.keys_file or self.jwt_secret or self.jwt_jwks)


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class SettingsError(ValueError):
    """An environment variable holds a value its setting cannot take; names the variable."""


def parse_bool(raw: str) -> bool:
    """Only the known spellings, case-insensitive: a typo must not turn a switch (auth) off."""
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"{raw!r} is not a boolean: use one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")


def _convert(name: str, raw: str, current: Any) -> Any:
    if name == "call_webhook_secret" and raw:
        if not raw.startswith("whsec_"):
            raise ValueError("a call webhook secret is 'whsec_' followed by base64")
        base64.b64decode(raw.removeprefix("whsec_"), validate=True)  # (binascii.Error is a ValueError)
        return raw
    if name in ("api_keys", "upstreams", "allowed_origins", "webrtc_advertised_addresses", "mcp_allowed_urls",
                "webrtc_peer_networks", "sip_allowed_sources", "sip_trunk_credentials"):  # fmt: skip
        return tuple(k.strip() for k in raw.split(",") if k.strip())
    if name in ("upstream_api_key", "engine_model", "video_model", "models", "replica_id", "keys_file",
                "jwt_secret", "jwt_jwks", "jwt_issuer", "jwt_audience", "otel_traces_endpoint",
                "webrtc_ice_servers", "webrtc_udp_ports", "live_responses_url", "live_responses_api_key",
                "twilio_auth_token", "vonage_websocket_authorization", "exotel_basic_auth", "call_webhook_url",
                "call_webhook_secret", "sip_rtp_ports", "sip_advertised_address", "sip_tls_cert", "sip_tls_key",
                "sip_session", "sip_model"):  # fmt: skip
        return raw or None
    if name == "auth_required":
        return parse_bool(raw)
    if name == "redis_url":
        return raw or None
    if name == "workers":
        return None if raw.strip().lower() in ("", "auto") else int(raw)
    if isinstance(current, bool):
        return parse_bool(raw)
    if isinstance(current, int):
        return int(raw)
    if isinstance(current, float):
        return float(raw)
    return raw


def from_env(environ: Mapping[str, str] | None = None, base: Settings | None = None) -> Settings:
    environ = os.environ if environ is None else environ
    settings = base or Settings()
    changes: dict[str, Any] = {}
    for f in fields(Settings):
        raw = environ.get(ENV_PREFIX + f.name.upper())
        if raw is not None:
            try:
                changes[f.name] = _convert(f.name, raw, getattr(settings, f.name))
            except ValueError as exc:  # refused at start, never read as a default
                raise SettingsError(f"{ENV_PREFIX}{f.name.upper()}: {exc}") from None
    return replace(settings, **changes)


def with_checkpoint_model(settings: Settings) -> Settings:
    """With engine vllm/omni and a checkpoint but no model name given, the default
    model is named after the checkpoint (the path as given), as ``vllm serve PATH``
    names it; a client that names another model still reaches it (the catch-all)."""
    if settings.engine in ("vllm", "omni") and settings.engine_model and settings.model == DEFAULT_MODEL:
        return replace(settings, model=settings.engine_model)
    return settings


def setting_names() -> list[str]:
    return [f.name for f in fields(Settings)]


__all__ = [
    "DEFAULT_MODEL",
    "ENGINES",
    "ENV_PREFIX",
    "Settings",
    "SettingsError",
    "field",
    "from_env",
    "is_loopback",
    "parse_bool",
    "setting_names",
    "with_checkpoint_model",
]
