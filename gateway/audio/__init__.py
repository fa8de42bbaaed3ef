"""Audio utilities: G.711 codecs, streaming resampling, voice-activity detection."""
