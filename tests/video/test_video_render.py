"""The CPU renderer: prompt signatures, captions, camera and blends (no encoding)."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.engines.video.render import (
    _GLYPHS,
    RenderState,
    caption_layers,
    glyph_bitmap,
    render_chunk,
    wrap_caption,
)
from orchestrator.video_engine import CameraMove, Interaction

W, H, FPS, F = 128, 96, 12, 4


def state(prompt: str = "A red fox in snow", seed: int = 0) -> RenderState:
    return RenderState(prompt, W, H, FPS, F, seed)


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().mean())


def test_a_prompt_renders_the_same_frames_every_time_and_animates() -> None:
    a, b = render_chunk(state(), 8), render_chunk(state(), 8)

    assert a.shape == (8, H, W, 3) and a.dtype == torch.uint8
    assert torch.equal(a, b)
    assert diff(a[0], a[7]) > 1.0  # it moves


def test_different_prompts_or_seeds_look_different() -> None:
    base = render_chunk(state("A red fox in snow"), 1)

    assert diff(base, render_chunk(state("A blue whale at night"), 1)) > 20
    assert diff(base, render_chunk(state("A red fox in snow", seed=7), 1)) > 20


def test_font_covers_letters_digits_and_punctuation() -> None:
    for char in "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,!?'\"-:;()/&+=#%*_@":
        assert char in _GLYPHS
        assert glyph_bitmap(char).shape == (7, 5)
    assert torch.equal(glyph_bitmap("a"), glyph_bitmap("A"))
    assert torch.equal(glyph_bitmap("€"), glyph_bitmap("?"))
    assert all(max(rows) < 32 for rows in _GLYPHS.values())


def test_caption_wraps_words_and_cuts_long_prompts() -> None:
    assert wrap_caption("a sea turtle glides", 10) == ["A SEA", "TURTLE", "GLIDES"]
    assert wrap_caption("supercalifragilistic", 8) == ["SUPERCAL", "IFRAGILI", "STIC"]
    assert wrap_caption("one two three four five six", 5, max_lines=2) == ["ONE", "TW..."]


def test_caption_draws_the_prompt_text_in_a_band_at_the_bottom() -> None:
    mul, add, top = caption_layers("HI", W, H)

    assert 0 < top < H
    assert float(add[..., :top, :].abs().sum()) == 0.0  # nothing above the band
    assert float(add[..., top:, :].sum()) > 0.0  # white strokes in it
    assert float(mul[..., :top, :].min()) == 1.0


def test_camera_pan_shifts_the_picture_by_the_requested_distance() -> None:
    still, moved = state(), state()
    moved.apply([Interaction("pan", camera=CameraMove("target", (0.25, 0.0, 0.0)), transition_chunks=0)])
    a, b = render_chunk(still, F), render_chunk(moved, F)
    _, _, top = caption_layers(still.target.prompt, W, H)

    shift = int(0.25 * min(W, H) / 2)  # one scene unit is half the shorter side
    assert diff(a[:, :top], b[:, :top]) > 5
    # Panning right by d moves the content left by d.
    assert diff(a[:, :top, shift:], b[:, :top, :-shift]) < 2
    assert moved.events.started == moved.events.completed == ["pan"]


def test_camera_zoom_and_roll_change_the_view() -> None:
    base = render_chunk(state(), 1)
    for move in (CameraMove("target", (0, 0, 1.0)), CameraMove("target", rotation=(0, 0, 30.0))):
        s = state()
        s.apply([Interaction("cam", camera=move, transition_chunks=0)])
        assert diff(base, render_chunk(s, 1)) > 5


def test_camera_velocity_keeps_moving_after_its_ramp() -> None:
    s = state()
    s.apply([Interaction("v", camera=CameraMove("velocity", (0.01, 0.0, 0.0)), transition_chunks=1)])
    render_chunk(s, F)
    assert s.events.completed == ["v"]  # the ramp to full speed took one chunk
    x1 = s.pose[0]
    render_chunk(s, F)
    x2 = s.pose[0]
    render_chunk(s, F)
    assert x2 - x1 == pytest.approx(0.04) and s.pose[0] - x2 == pytest.approx(0.04)
    # A target replaces the velocity: the camera goes there and stops.
    s.apply([Interaction("t", camera=CameraMove("target", (0.0, 0.0, 0.0)), transition_chunks=1)])
    render_chunk(s, F)
    render_chunk(s, F)
    assert s.pose == [0.0] * 6


def test_camera_quaternion_converts_to_yaw_pitch_roll() -> None:
    half = math.radians(6.0) / 2
    move = CameraMove.from_quaternion("velocity", (0.0, 0.0, 0.05), (0.0, math.sin(half), 0.0, math.cos(half)))
    assert move.rotation == pytest.approx((6.0, 0.0, 0.0), abs=1e-9)
    assert move.translation == (0.0, 0.0, 0.05)


@pytest.mark.parametrize("k", [0, 1, 3])
def test_prompt_fade_reaches_the_new_prompt_on_the_last_frame_of_chunk_k(k: int) -> None:
    s = state("A red fox in snow")
    render_chunk(s, F)
    s.apply([Interaction("e", prompt="A blue whale at night", transition_chunks=k)])
    frames = torch.cat([render_chunk(s, F) for _ in range(k + 1)]).float()
    old = render_chunk(state("A red fox in snow"), F * (k + 2))[F:].float()
    new = render_chunk(state("A blue whale at night"), F * (k + 2))[F:].float()

    d = (new - old).flatten(1)
    alphas = (((frames - old).flatten(1) * d).sum(1) / (d * d).sum(1)).tolist()
    total = max(1, k * F)
    expected = [min(1.0, (j + 1) / total) if k else 1.0 for j in range(len(alphas))]
    assert alphas == pytest.approx(expected, abs=0.01)


def test_a_newer_prompt_supersedes_a_fade_and_starts_from_its_blend() -> None:
    s = state("A red fox in snow")
    s.apply([Interaction("a", prompt="A blue whale at night", transition_chunks=4)])
    render_chunk(s, F)
    assert (s.events.started, s.events.active, s.events.completed) == (["a"], ["a"], [])
    s.apply([Interaction("b", prompt="A green forest", transition_chunks=1)])
    frames = render_chunk(s, F).float()

    # "a" had reached weight 1/4 at the boundary; "b" fades in over that blend.
    prompts = ("A red fox in snow", "A blue whale at night", "A green forest")
    fox, whale, forest = (render_chunk(state(p), 2 * F)[F:].float() for p in prompts)
    alpha = (torch.arange(1, F + 1).float() / F).view(F, 1, 1, 1)
    expected = (fox * 0.75 + whale * 0.25) * (1 - alpha) + forest * alpha
    assert diff(frames, expected) < 1.0
    assert s.events.started == ["b"] and s.events.active == ["b"]
    assert s.events.completed == ["a", "b"] and s.events.superseded == ["a"]
    assert [scene.prompt for scene, _ in s.sources] == []  # done: only the target remains
    assert s.target.prompt == "A green forest"


def test_extreme_camera_values_render_without_error() -> None:
    s = state()
    far = CameraMove("target", (1e4, -1e4, -1e4), (1e4, 1e4, 1e4))
    s.apply([Interaction("far", camera=far, transition_chunks=0)])
    frames = render_chunk(s, F)
    assert frames.shape == (F, H, W, 3)
