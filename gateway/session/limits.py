"""The per-session limits (pure data), shared by the parts that enforce them."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.protocol.errors import Code, ProtocolError


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
    max_images: int = 32  # input_image parts in the conversation beyond this: the next item added
    #   deletes the oldest the same way; an item (or a response's input) holding more alone: invalid_value
    max_image_pixels: int = 50_000_000  # the pixels they declare, in all (what decoding them for one
    #   response costs: 150 MB as RGB); beyond: as for max_images
    lifetime_s: float = 3_600.0  # then error session_expired and close 4008 (enforced by the shell)
    max_out_of_band: int = 4  # out-of-band responses (conversation "none") running at once, beside the
    #   conversation's one; another: conversation_already_has_active_response


def check_images(images: tuple[int, int], limits: SessionLimits, param: str) -> None:
    """Refuse what alone holds more images, or pixels, than the whole conversation may:
    (count, declared pixels) of one item, or of a response's input (``invalid_value``)."""
    count, pixels = images
    if count > limits.max_images or pixels > limits.max_image_pixels:
        raise ProtocolError(
            Code.INVALID_VALUE,
            f"This holds {count} images declaring {pixels:,} pixels; a conversation holds at most "
            f"{limits.max_images} images and {limits.max_image_pixels:,} pixels "
            "(max_conversation_images, max_conversation_image_pixels): send fewer or smaller ones.",
            param=param,
        )
