"""The per-session limits (pure data), shared by the parts that enforce them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-session limits; each is enforced with the error named beside it."""

    max_append_ms: int = 300_000  # one append longer than this: audio_append_too_large, dropped
    max_buffer_ms: int = 300_000  # uncommitted audio beyond this: input_audio_buffer_full (manual
    #   turns; the append is refused) or an automatic commit (server VAD)
    min_commit_ms: int = 100  # a commit of less audio: input_audio_buffer_commit_empty
    max_items: int = 1_000  # conversation longer than this: the oldest items are deleted
    #   (conversation.item.deleted is sent for each)
    max_conversation_bytes: int = 4 << 20  # the conversation's text, images and transcript marks
    #   (Item.counted_bytes, counted as each item changes) beyond this: the next item added
    #   deletes the oldest the same way
    lifetime_s: float = 3_600.0  # then error session_expired and close 4008 (enforced by the shell)
    max_out_of_band: int = 4  # out-of-band responses (conversation "none") running at once, beside the
    #   conversation's one; another: conversation_already_has_active_response
