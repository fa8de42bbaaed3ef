"""Images in: ``input_image`` parts (GA), checked where they come in, kept in the
conversation (and its snapshot), handed to engines that take images, and refused
with a coded error naming the part everywhere else. No URL is ever fetched."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from support.images import data_url, png
from support.session_driver import Driver

from gateway.protocol import client_events as ce
from gateway.protocol.bounds import MAX_IMAGE_BYTES
from gateway.protocol.errors import Code, ProtocolError
from gateway.session.effects import StartResponse
from gateway.session.session import RealtimeSession
from orchestrator.engine import Image
from orchestrator.engines.passthrough import PassthroughEngine

PNG = png(4, 3)
SEEING = dataclasses.replace(PassthroughEngine().info, accepts_images=True)  # an engine that takes images


def item(*parts: dict[str, Any], role: str = "user") -> dict[str, Any]:
    return {"type": "conversation.item.create", "event_id": "img",
            "item": {"type": "message", "role": role, "content": list(parts)}}  # fmt: skip


def image_part(url: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"type": "input_image", "image_url": url or data_url(PNG), **extra}


def jpeg(width: int, height: int) -> bytes:
    """The head of a baseline JPEG of ``width`` x ``height`` (SOI, an APP0, SOF0): what a
    header reader needs, with no image data (the engines' decoder would refuse it)."""
    app0 = b"\xff\xe0" + (16).to_bytes(2, "big") + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + (17).to_bytes(2, "big") + b"\x08" + height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return b"\xff\xd8" + app0 + sof0 + b"\x03\x01\x22\x00\x02\x11\x01\x03\x11\x01" + b"\xff\xd9"


def refused(event: dict[str, Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        ce.decode(orjson.dumps(event))
    return info.value


def test_a_png_data_url_decodes_as_an_input_image_part() -> None:
    event = ce.decode(orjson.dumps(item({"type": "input_text", "text": "What is it?"}, image_part(detail="low"))))
    assert isinstance(event, ce.ItemCreate)
    part = event.item.content[1]
    assert (part.type, part.detail, part.image_url) == ("input_image", "low", data_url(PNG))
    head = jpeg(4, 3)
    event = ce.decode(orjson.dumps(item(image_part(data_url(head, "image/jpg")))))
    assert event.item.content[0].image_url == data_url(head, "image/jpeg")  # (image/jpg named as it is)


@pytest.mark.parametrize(
    ("part", "param", "says"),
    [
        (image_part("https://example.com/cat.png"), "item.content[0].image_url", "fetches no URL"),
        (image_part("file:///etc/passwd"), "item.content[0].image_url", "fetches no URL"),
        (image_part(data_url(b"GIF89a....", "image/gif")), "item.content[0].image_url", "PNG or JPEG"),
        (image_part(data_url(b"\xff\xd8\xff not a png")), "item.content[0].image_url", "does not hold a image/png"),
        (
            image_part(data_url(b"\xff\xd8\xff\xe0" + bytes(16), "image/jpeg")),
            "item.content[0].image_url",
            "cannot be read",
        ),
        (image_part("data:image/png,rawbytes"), "item.content[0].image_url", "base64"),
        (image_part("data:image/png;base64,@@@"), "item.content[0].image_url", "not valid base64"),
        (image_part(detail="ultra"), "item.content[0].detail", "auto, low or high"),
        ({"type": "input_image"}, "item.content[0].image_url", "data URL"),
    ],
)
def test_a_bad_image_is_refused_naming_the_part(part: dict[str, Any], param: str, says: str) -> None:
    err = refused(item(part))
    assert (err.param, err.event_id) == (param, "img")
    assert says in err.message


def test_an_image_over_the_bound_is_refused_before_it_is_decoded() -> None:
    big = "data:image/png;base64," + "A" * ((MAX_IMAGE_BYTES + 2) // 3 * 4 + 4)
    err = refused(item(image_part(big)))
    assert err.param == "item.content[0].image_url" and f"{MAX_IMAGE_BYTES >> 20} MiB" in err.message


def test_only_user_messages_carry_images() -> None:
    err = refused(item(image_part(), role="assistant"))
    assert (err.code, err.param) == (Code.INVALID_VALUE, "item.content[0].type")


def test_an_engine_that_takes_no_images_refuses_the_part_and_the_session_goes_on() -> None:
    d = Driver()  # the passthrough engine: no images
    err = d.error(item({"type": "input_text", "text": "look"}, image_part()))
    assert (err["code"], err["param"], err["event_id"]) == (Code.UNSUPPORTED, "item.content[1]", "img")
    assert "takes no images" in err["message"] and "accepts_images" in err["message"]
    assert len(d.session.conversation) == 0
    d.user_text("still here")
    assert len(d.session.conversation) == 1
    # response.input items are checked the same way
    err = d.error({"type": "response.create", "response": {"conversation": "none", "input": [
        {"type": "message", "role": "user", "content": [image_part()]}]}})  # fmt: skip
    assert (err["code"], err["param"]) == (Code.UNSUPPORTED, "response.input[0].content[0]")


def test_the_beta_protocol_has_no_images() -> None:
    d = Driver(beta=True, engine=SEEING)
    err = d.error(item(image_part()))
    assert (err["code"], err["param"]) == (Code.UNSUPPORTED, "item.content[0]")


def test_an_image_reaches_the_engine_is_echoed_as_sent_and_survives_a_snapshot() -> None:
    d = Driver(engine=SEEING)
    events, _ = d.send(item({"type": "input_text", "text": "What colour?"}, image_part(detail="high")))
    added = next(e for e in events if e["type"] == "conversation.item.added")
    assert added["item"]["content"][1] == {"type": "input_image", "image_url": data_url(PNG), "detail": "high"}
    _, effects = d.send({"type": "response.create"})
    request = next(e for e in effects if isinstance(e, StartResponse)).request
    (message,) = request.messages
    assert message.text == "What colour?"
    assert message.images == (Image("image/png", PNG, "high"),)
    # Another replica, from the snapshot, gives the engine the same image.
    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    again = RealtimeSession.restore(state, engine=SEEING, vad_factory=None)
    assert again.conversation.messages()[0].images == (Image("image/png", PNG, "high"),)


def test_images_count_in_the_conversations_bytes() -> None:
    d = Driver(engine=SEEING)
    d.send(item(image_part()))
    (only,) = d.session.conversation
    assert only.counted_bytes() == len(data_url(PNG))


# --- what images may cost (issue 33, finding 3) ---------------------------------------


def test_the_pixels_an_image_declares_are_read_from_its_header() -> None:
    from gateway.protocol.image_size import image_size

    assert image_size(png(5000, 5000)) == (5000, 5000)
    assert image_size(jpeg(4032, 3024)) == (4032, 3024)
    assert image_size(b"\x89PNG\r\n\x1a\n" + b"\x00" * 4) is None
    assert image_size(b"\xff\xd8\xff\xda\x00\x02") is None  # a scan before any frame header


def test_an_image_declaring_more_than_one_may_is_refused_when_it_comes_in() -> None:
    err = refused(item(image_part(data_url(png(5001, 5000)))))
    assert err.code == Code.INVALID_VALUE and err.param == "item.content[0].image_url"
    assert "5001x5000" in err.message
    (spec,) = ce.decode(orjson.dumps(item(image_part(data_url(jpeg(5000, 5000), "image/jpeg"))))).item.content
    assert spec.pixels == 25_000_000


def test_a_conversation_keeps_a_bounded_number_of_images_and_pixels() -> None:
    """Was: 960 copies of a 3 KB PNG declaring 5000x5000 fitted in one conversation (93 GiB
    decoded for one response). Now the pixels bound it: the oldest go as new ones come."""
    from gateway.session.limits import SessionLimits

    d = Driver(engine=SEEING, limits=SessionLimits(max_images=4, max_image_pixels=50_000_000))
    bomb = data_url(png(5000, 5000))
    deleted = 0
    for _ in range(20):
        events, _ = d.send(item(image_part(bomb)))
        deleted += sum(e["type"] == "conversation.item.deleted" for e in events)
    assert [it.images() for it in d.session.conversation] == [(1, 25_000_000)] * 2 and deleted == 18
    small = data_url(png(4, 3))
    for _ in range(6):
        d.send(item(image_part(small)))
    assert sum(it.images()[0] for it in d.session.conversation) == 4  # the count bounds them too
    _, effects = d.send({"type": "response.create"})
    request = next(e for e in effects if isinstance(e, StartResponse)).request
    assert sum(len(m.images) for m in request.messages) == 4
    # Restored elsewhere, the same bounds count the same images.
    state = orjson.loads(orjson.dumps(d.session.snapshot_state()))
    for saved in state["items"]:
        for part in saved["content"]:
            part.pop("pixels", None)  # (a snapshot written before pixels were kept: read again)
    again = RealtimeSession.restore(state, engine=SEEING, vad_factory=None)
    assert [it.images() for it in again.conversation] == [it.images() for it in d.session.conversation]


def test_what_alone_holds_more_than_a_conversation_may_is_refused() -> None:
    from gateway.session.limits import SessionLimits

    d = Driver(engine=SEEING, limits=SessionLimits(max_images=2, max_image_pixels=30_000_000))
    events, _ = d.send(item(*[image_part() for _ in range(3)]))
    err = next(e for e in events if e["type"] == "error")["error"]
    assert err["code"] == Code.INVALID_VALUE and err["param"] == "item.content"
    assert not any(e["type"] == "conversation.item.added" for e in events)
    out_of_band = {"type": "response.create", "response": {"conversation": "none", "input": [
        {"type": "message", "role": "user", "content": [image_part(data_url(png(5000, 5000)))]},
        {"type": "message", "role": "user", "content": [image_part(data_url(png(3000, 3000)))]},
    ]}}  # fmt: skip
    events, effects = d.send(out_of_band)
    err = next(e for e in events if e["type"] == "error")["error"]
    assert err["code"] == Code.INVALID_VALUE and err["param"] == "response.input"
    assert not any(isinstance(e, StartResponse) for e in effects)
