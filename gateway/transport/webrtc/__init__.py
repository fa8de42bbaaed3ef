"""WebRTC media for realtime sessions: SDP offer checks (``sdp``, pure), the paced outgoing
audio track with its sent-audio ledger (``audio_out``), the incoming Opus track turned into
PCM16 chunks (``audio_in``), the ``oai-events`` data channel (``datachannel``), the ICE/UDP
settings (``config``) and the peer connections built from them (``peer``).

Everything but ``sdp`` and ``config`` needs the ``webrtc`` extra (aiortc, PyAV); nothing is
imported here, so the gateway imports without it.
"""
