"""Carriers' media streams: ``/v1/telephony/{carrier}`` (see docs/telephony.md)."""
