"""What the video engines that pass interactions on to a model share: the
checks made before one is sent, and its shape on the way.

``hold_event_id`` checks an interaction for a running request and takes its
event id (each is used once per request); the engine gives it back when the
interaction is refused. ``interaction_payload`` is AsyncOmni's
``OmniInteractionPrompt``, which vLLM-Omni's ``/v1/realtime/video`` takes as
the ``interaction`` of its ``session.interaction`` event.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from orchestrator.engine import EngineError
from orchestrator.video_engine import Interaction, validate_interaction


class InteractiveRequest(Protocol):
    """A running video request as ``hold_event_id`` reads it."""

    aborted: bool
    event_ids: set[str]  # the event ids used so far


R = TypeVar("R", bound=InteractiveRequest)


def hold_event_id(request_id: str, request: R | None, interaction: Interaction) -> R:
    """``request`` (None: ``request_id`` is not running), once ``interaction`` is
    valid for it, with the interaction's event id taken; ``EngineError``
    (``invalid_interaction``, ``no_active_request``, ``event_id_conflict``) otherwise."""
    validate_interaction(interaction)
    if request is None or request.aborted:
        raise EngineError("no_active_request", f"no active video request {request_id!r}")
    if interaction.event_id in request.event_ids:
        raise EngineError("event_id_conflict", f"event_id {interaction.event_id!r} was already used")
    request.event_ids.add(interaction.event_id)
    return request


def interaction_payload(interaction: Interaction) -> dict[str, Any]:
    """An ``Interaction`` as AsyncOmni's ``OmniInteractionPrompt``."""
    event: dict[str, Any] = {}
    if interaction.prompt is not None:
        event["prompt"] = interaction.prompt
    if interaction.camera is not None:
        cam = interaction.camera
        event["multi_modal_data"] = {
            "camera": {
                "mode": cam.mode,
                "data": {"translation": list(cam.translation), "rotation": list(cam.rotation)},
            }
        }
    return {"event_id": interaction.event_id, "event": event, "transition_chunks": interaction.transition_chunks}
