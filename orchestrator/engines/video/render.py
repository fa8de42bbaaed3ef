"""Frames rendered on the CPU with torch from the prompt: no model, no weights.

A prompt (with the request's seed) hashes to a deterministic *scene*: a
palette, a periodic background gradient with moving stripes, a few soft
discs that move in one of several patterns, and the prompt's words drawn as
a caption with a built-in 5x7 bitmap font. The scene lives on an infinite
periodic plane, so the camera (pan, zoom, roll: a 2-D approximation of the
3-D moves in ``CameraMove``) always has something to show.

Transitions are real blends of renderings: a new prompt fades in linearly
per frame over ``transition_chunks`` chunks, reaching weight 1 on the last
frame of the last of them; 0 cuts at the next chunk. A newer prompt that
arrives during a fade starts from the blend reached at that boundary (the
older event is reported completed and superseded). The camera track works
the same way with poses (``target``) or per-frame velocities (``velocity``).
"""

from __future__ import annotations

import colorsys
import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from orchestrator.video_engine import CameraMove, Interaction

# Limits. MAX_FADE_SOURCES: scenes a fade starts from (on top of its target);
# a newer prompt during a fade keeps the heaviest ones and renormalises, so a
# frame never renders more than MAX_FADE_SOURCES + 1 scenes.
MAX_FADE_SOURCES = 2
MIN_LAYER_WEIGHT = 1.0 / 512  # lighter layers are invisible in 8-bit output; dropped
# Frames rendered per torch batch, by pixels: bounds temporary memory (about
# 100 bytes per pixel) whatever the frame size; larger chunks run in batches.
RENDER_BATCH_PIXELS = 1 << 20
MAX_CAPTION_LINES = 3  # longer prompts are cut and end with "..."
MAX_ZOOM_STOPS = 8.0  # |z| is clamped here (256x in or out); the pose itself keeps moving

_PERIOD = 2.0  # scene units between repeats of a disc (the frame's short side is 2)

# --- the 5x7 bitmap font -----------------------------------------------------
# Seven rows per glyph, five bits per row, most significant bit on the left.
_GLYPHS: dict[str, tuple[int, ...]] = {
    "A": (14, 17, 17, 31, 17, 17, 17), "B": (30, 17, 17, 30, 17, 17, 30),
    "C": (14, 17, 16, 16, 16, 17, 14), "D": (30, 17, 17, 17, 17, 17, 30),
    "E": (31, 16, 16, 30, 16, 16, 31), "F": (31, 16, 16, 30, 16, 16, 16),
    "G": (14, 17, 16, 23, 17, 17, 15), "H": (17, 17, 17, 31, 17, 17, 17),
    "I": (14, 4, 4, 4, 4, 4, 14), "J": (7, 2, 2, 2, 2, 18, 12),
    "K": (17, 18, 20, 24, 20, 18, 17), "L": (16, 16, 16, 16, 16, 16, 31),
    "M": (17, 27, 21, 21, 17, 17, 17), "N": (17, 17, 25, 21, 19, 17, 17),
    "O": (14, 17, 17, 17, 17, 17, 14), "P": (30, 17, 17, 30, 16, 16, 16),
    "Q": (14, 17, 17, 17, 21, 18, 13), "R": (30, 17, 17, 30, 20, 18, 17),
    "S": (15, 16, 16, 14, 1, 1, 30), "T": (31, 4, 4, 4, 4, 4, 4),
    "U": (17, 17, 17, 17, 17, 17, 14), "V": (17, 17, 17, 17, 17, 10, 4),
    "W": (17, 17, 17, 21, 21, 21, 10), "X": (17, 17, 10, 4, 10, 17, 17),
    "Y": (17, 17, 10, 4, 4, 4, 4), "Z": (31, 1, 2, 4, 8, 16, 31),
    "0": (14, 17, 19, 21, 25, 17, 14), "1": (4, 12, 4, 4, 4, 4, 14),
    "2": (14, 17, 1, 2, 4, 8, 31), "3": (31, 2, 4, 2, 1, 17, 14),
    "4": (2, 6, 10, 18, 31, 2, 2), "5": (31, 16, 30, 1, 1, 17, 14),
    "6": (6, 8, 16, 30, 17, 17, 14), "7": (31, 1, 2, 4, 8, 8, 8),
    "8": (14, 17, 17, 14, 17, 17, 14), "9": (14, 17, 17, 15, 1, 2, 12),
    " ": (0, 0, 0, 0, 0, 0, 0), ".": (0, 0, 0, 0, 0, 12, 12),
    ",": (0, 0, 0, 0, 12, 4, 8), "!": (4, 4, 4, 4, 4, 0, 4),
    "?": (14, 17, 1, 2, 4, 0, 4), "'": (4, 4, 8, 0, 0, 0, 0),
    '"': (10, 10, 0, 0, 0, 0, 0), "-": (0, 0, 0, 31, 0, 0, 0),
    ":": (0, 12, 12, 0, 12, 12, 0), ";": (0, 12, 12, 0, 12, 4, 8),
    "(": (2, 4, 8, 8, 8, 4, 2), ")": (8, 4, 2, 2, 2, 4, 8),
    "/": (0, 1, 2, 4, 8, 16, 0), "&": (12, 18, 20, 8, 21, 18, 13),
    "+": (0, 4, 4, 31, 4, 4, 0), "=": (0, 0, 31, 0, 31, 0, 0),
    "#": (10, 10, 31, 10, 31, 10, 10), "%": (24, 25, 2, 4, 8, 19, 3),
    "*": (0, 4, 21, 14, 21, 4, 0), "_": (0, 0, 0, 0, 0, 0, 31),
    "@": (14, 17, 23, 21, 23, 16, 15),
}  # fmt: skip
_GLYPH_W, _GLYPH_H = 5, 7


def glyph_bitmap(char: str) -> torch.Tensor:
    """The 7x5 bool bitmap of ``char`` (upper-cased; unknown characters: '?')."""
    rows = _GLYPHS.get(char.upper(), _GLYPHS["?"])
    bits = [[(row >> (_GLYPH_W - 1 - col)) & 1 for col in range(_GLYPH_W)] for row in rows]
    return torch.tensor(bits, dtype=torch.bool)


def wrap_caption(text: str, width_chars: int, max_lines: int = MAX_CAPTION_LINES) -> list[str]:
    """Word-wrap ``text`` into at most ``max_lines`` lines of ``width_chars``."""
    width_chars = max(1, width_chars)
    lines: list[str] = []
    line = ""
    for word in text.upper().split():
        while len(word) > width_chars:  # a word longer than a line is split
            if line:
                lines.append(line)
                line = ""
            lines.append(word[:width_chars])
            word = word[width_chars:]
        candidate = f"{line} {word}" if line else word
        if len(candidate) <= width_chars:
            line = candidate
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = (lines[-1][: max(0, width_chars - 3)] + "...")[:width_chars]
    return lines


def caption_layers(text: str, width: int, height: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(mul [1,1,H,W], add [1,3,H,W], top): ``frame * mul + add`` draws the
    caption, white text on a darkened band at the bottom of the frame; rows
    above ``top`` are left as they are."""
    scale = max(1, min(width, height) // 128)
    cell_w, cell_h = (_GLYPH_W + 1) * scale, (_GLYPH_H + 2) * scale
    margin = 2 * scale
    # The caption covers at most half the frame.
    lines = wrap_caption(text, (width - 2 * margin) // cell_w, min(MAX_CAPTION_LINES, max(1, height // 2 // cell_h)))
    text_mask = torch.zeros(height, width)
    band_top = max(0, height - margin * 2 - cell_h * len(lines))
    for row, line in enumerate(lines):
        top = band_top + margin + row * cell_h + scale
        for col, char in enumerate(line):
            left = margin + col * cell_w
            glyph = glyph_bitmap(char).float()
            glyph = glyph.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
            h = min(glyph.shape[0], height - top)
            w = min(glyph.shape[1], width - left)
            if h > 0 and w > 0:
                text_mask[top : top + h, left : left + w] = glyph[:h, :w]
    band = torch.zeros(height, width)
    band[band_top:, :] = 0.55
    mul = ((1.0 - band) * (1.0 - text_mask)).view(1, 1, height, width)
    add = (text_mask * 0.96).view(1, 1, height, width).expand(1, 3, height, width).contiguous()
    return mul, add, band_top


# --- scenes --------------------------------------------------------------------

_MOTIONS = ("orbit", "drift", "pulse", "lissajous")


@dataclass(frozen=True, slots=True)
class _Disc:
    x: float
    y: float
    radius: float
    color: tuple[float, float, float]
    speed: float  # radians per second (orbit, pulse, lissajous) or units/s (drift)
    phase: float
    reach: float  # orbit radius, drift heading, pulse depth


class Scene:
    """The deterministic visual signature of one prompt (and seed)."""

    def __init__(self, prompt: str, seed: int, width: int, height: int) -> None:
        self.prompt = prompt
        digest = hashlib.blake2b(f"{seed}\x00{prompt}".encode(), digest_size=16).digest()
        rng = random.Random(int.from_bytes(digest, "big"))
        hue = rng.random()
        spread = rng.choice((0.08, 0.33, 0.5))  # analogous, triadic or complementary

        def color(h: float, s: float, v: float) -> tuple[float, float, float]:
            r, g, b = colorsys.hsv_to_rgb(h % 1.0, s, v)
            return (r, g, b)

        def as_tensor(c: tuple[float, float, float]) -> torch.Tensor:
            return torch.tensor(c).view(1, 3, 1, 1)

        self.low = as_tensor(color(hue, 0.7, 0.25 + 0.2 * rng.random()))
        self.high = as_tensor(color(hue + spread, 0.55, 0.65 + 0.3 * rng.random()))
        self.stripe = as_tensor(color(hue + 2 * spread, 0.5, 0.9))
        self.gradient = (rng.uniform(0, math.tau), rng.uniform(0.8, 2.5), rng.uniform(0.3, 1.2))
        self.stripes = (rng.uniform(0, math.tau), rng.uniform(6, 14), rng.uniform(1, 3))
        self.stripe_strength = rng.uniform(0.1, 0.3)
        self.motion = rng.choice(_MOTIONS)
        self.discs = [
            _Disc(
                x=rng.uniform(-1, 1),
                y=rng.uniform(-1, 1),
                radius=rng.uniform(0.15, 0.4),
                color=color(hue + spread * rng.choice((-1, 0.5, 1, 2)), rng.uniform(0.5, 1), 1.0),
                speed=rng.uniform(0.6, 2.0) * rng.choice((-1, 1)),
                phase=rng.uniform(0, math.tau),
                reach=rng.uniform(0.2, 0.5),
            )
            for _ in range(4)
        ]
        self.caption_mul, self.caption_add, self.caption_top = caption_layers(prompt, width, height)

    def _disc_at(self, disc: _Disc, t: float) -> tuple[float, float, float]:
        """Centre and radius of ``disc`` at time ``t`` seconds."""
        a = disc.speed * t + disc.phase
        if self.motion == "orbit":
            return disc.x + disc.reach * math.cos(a), disc.y + disc.reach * math.sin(a), disc.radius
        if self.motion == "drift":
            heading = disc.phase
            dist = 0.25 * disc.speed * t
            return disc.x + dist * math.cos(heading), disc.y + dist * math.sin(heading), disc.radius
        if self.motion == "pulse":
            r = disc.radius * (1.0 + 0.6 * disc.reach * math.sin(a))
            return disc.x + 0.1 * math.cos(0.5 * a), disc.y, r
        return disc.x + disc.reach * math.sin(a), disc.y + 0.5 * disc.reach * math.sin(2 * a), disc.radius

    def render(self, times: Sequence[float], wx: torch.Tensor, wy: torch.Tensor) -> torch.Tensor:
        """float32 [n,3,H,W] in [0,1] at scene coordinates ``wx``, ``wy``.

        ``wx``/``wy`` broadcast to [n,H,W]: [n,1,W] and [n,H,1] when the view
        is not rolled, which keeps most per-pixel work on rows and columns.
        Full-frame temporaries are few and reused: allocation, not arithmetic,
        dominates at these sizes.
        """
        n = len(times)
        t = torch.tensor(times, dtype=torch.float32).view(n, 1, 1)
        h, w = max(wx.shape[1], wy.shape[1]), max(wx.shape[2], wy.shape[2])
        plane = torch.empty((n, h, w))
        img = torch.empty((n, 3, h, w))
        angle, freq, speed = self.gradient
        wave = wy * (math.sin(angle) * freq) + t * speed
        torch.add(wx * (math.cos(angle) * freq), wave, out=plane).sin_().mul_(0.5).add_(0.5)
        torch.mul(self.high - self.low, plane.unsqueeze(1), out=img).add_(self.low)
        angle, freq, speed = self.stripes
        wave = wy * (math.sin(angle) * freq) - t * speed
        torch.add(wx * (math.cos(angle) * freq), wave, out=plane).sin_()
        plane.clamp_(min=0.0).mul_(self.stripe_strength)
        img.lerp_(self.stripe.expand_as(img), plane.unsqueeze(1))
        for disc in self.discs:
            centres = [self._disc_at(disc, float(tt)) for tt in times]
            cx = torch.tensor([c[0] - _PERIOD / 2 for c in centres]).view(n, 1, 1)
            cy = torch.tensor([c[1] - _PERIOD / 2 for c in centres]).view(n, 1, 1)
            r = torch.tensor([c[2] for c in centres]).view(n, 1, 1)
            # Squared distance to the nearest repeat of the disc (the plane is
            # periodic), split by axis so each part stays on a row or column.
            dx2 = torch.sub(wx, cx).remainder_(_PERIOD).sub_(_PERIOD / 2).square_()
            dy2 = torch.sub(wy, cy).remainder_(_PERIOD).sub_(_PERIOD / 2).square_()
            # Soft edge about 0.03 units wide, without a sqrt: (r²-d²)/(2r·edge).
            k = (1.0 / (2 * 0.03)) / r
            torch.sub((r * r - dx2).mul_(k), dy2.mul_(k), out=plane).clamp_(0.0, 1.0)
            color = torch.tensor(disc.color).view(1, 3, 1, 1)
            img.lerp_(color.expand_as(img), plane.unsqueeze(1))
        top = self.caption_top  # the caption only touches the rows of its band
        band = img[:, :, top:, :]
        band.mul_(self.caption_mul[:, :, top:, :]).add_(self.caption_add[:, :, top:, :])
        return img


def view_grid(width: int, height: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Screen coordinates [1,H,W]: +x right, +y up, the shorter side spans [-1, 1]."""
    short = min(width, height)
    xs = (torch.arange(width, dtype=torch.float32) + 0.5 - width / 2) * (2.0 / short)
    ys = (height / 2 - torch.arange(height, dtype=torch.float32) - 0.5) * (2.0 / short)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return gx.unsqueeze(0), gy.unsqueeze(0)


def view_transform(
    poses: Sequence[Sequence[float]], gx: torch.Tensor, gy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scene coordinates (broadcasting to [n,H,W]) seen by camera poses (x, y, z, yaw, pitch, roll):
    x/yaw pan right, y/pitch pan up (45 degrees = one scene unit), z zooms
    (2**z magnification, z clamped to ±MAX_ZOOM_STOPS), roll turns the view
    counter-clockwise."""
    n = len(poses)

    def col(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).view(n, 1, 1)

    scale = [2.0 ** -max(-MAX_ZOOM_STOPS, min(MAX_ZOOM_STOPS, p[2])) for p in poses]
    roll = [math.radians(p[5]) for p in poses]
    a = col([s * math.cos(r) for s, r in zip(scale, roll, strict=True)])
    b = col([s * math.sin(r) for s, r in zip(scale, roll, strict=True)])
    cx = col([p[0] + p[3] / 45.0 for p in poses])
    cy = col([p[1] + p[4] / 45.0 for p in poses])
    if not any(roll):  # separable: x depends on the column only, y on the row only
        return (gx[:, :1, :] * a).add_(cx), (gy[:, :, :1] * a).add_(cy)
    wx = (gx * a).sub_(gy * b).add_(cx)
    wy = (gx * b).add_(gy * a).add_(cy)
    return wx, wy


# --- tracks and transitions ----------------------------------------------------


@dataclass(slots=True)
class _Fade:
    """A transition in progress on one track: ``total`` frames (0: a cut)."""

    event_id: str
    total: int
    done: int = 0

    def alpha(self, j: int) -> float:
        """Weight of the target at frame ``j`` of the current chunk."""
        return 1.0 if self.total == 0 else min(1.0, (self.done + j + 1) / self.total)

    @property
    def reached(self) -> float:
        """Weight reached at the last rendered frame."""
        return 1.0 if self.total == 0 else min(1.0, self.done / self.total)


@dataclass(slots=True)
class ChunkEvents:
    """Event ids of one chunk, as ``VideoChunk`` reports them."""

    started: list[str] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)
    superseded: list[str] = field(default_factory=list)


_ZERO = (0.0,) * 6


class RenderState:
    """Everything one request needs to render its next chunk."""

    def __init__(self, prompt: str, width: int, height: int, fps: int, frames_per_chunk: int, seed: int = 0) -> None:
        self.width, self.height, self.fps, self.seed = width, height, fps, seed
        self.frames_per_chunk = frames_per_chunk
        self.frame_index = 0  # next frame to render
        self.chunk_index = 0  # next chunk to render
        self.target = Scene(prompt, seed, width, height)
        self.sources: list[tuple[Scene, float]] = []  # the blend a prompt fade starts from
        self.prompt_fade: _Fade | None = None
        self.pose = list(_ZERO)  # after the last rendered frame
        self.velocity = list(_ZERO)  # per frame
        self.camera_mode: str | None = None  # None: still
        self.camera_from = list(_ZERO)  # pose (target) or velocity (velocity) at the fade start
        self.camera_goal = list(_ZERO)
        self.camera_fade: _Fade | None = None
        self.events = ChunkEvents()  # of the last rendered chunk
        self._next_events = ChunkEvents()  # of the chunk about to be rendered
        self._pending_tracks: dict[str, set[str]] = {}  # event id -> tracks still fading
        self._superseded: set[str] = set()
        self._grid = view_grid(width, height)

    def apply(self, interactions: Sequence[Interaction]) -> None:
        """Start ``interactions`` (validated, in arrival order) at this boundary."""
        events = self._next_events
        for item in interactions:
            events.started.append(item.event_id)
            frames = item.transition_chunks * self.frames_per_chunk
            self._pending_tracks[item.event_id] = set()
            if item.prompt is not None:
                self._start_prompt(item.event_id, item.prompt, frames, events)
            if item.camera is not None:
                self._start_camera(item.event_id, item.camera, frames, events)

    def _supersede(self, fade: _Fade | None, track: str, events: ChunkEvents) -> None:
        if fade is None or fade.event_id not in self._pending_tracks:
            return
        self._superseded.add(fade.event_id)
        self._finish(fade.event_id, track, events)

    def _finish(self, event_id: str, track: str, events: ChunkEvents) -> None:
        tracks = self._pending_tracks.get(event_id)
        if tracks is None:
            return
        tracks.discard(track)
        if not tracks:
            del self._pending_tracks[event_id]
            events.completed.append(event_id)
            if event_id in self._superseded:
                self._superseded.discard(event_id)
                events.superseded.append(event_id)

    def _start_prompt(self, event_id: str, prompt: str, frames: int, events: ChunkEvents) -> None:
        self._supersede(self.prompt_fade, "prompt", events)
        self.sources = _merge_layers(self._prompt_layers(None))
        self.target = Scene(prompt, self.seed, self.width, self.height)
        self.prompt_fade = _Fade(event_id, frames)
        self._pending_tracks[event_id].add("prompt")

    def _start_camera(self, event_id: str, move: CameraMove, frames: int, events: ChunkEvents) -> None:
        self._supersede(self.camera_fade, "camera", events)
        goal = [*map(float, move.translation), *map(float, move.rotation)]
        if move.mode == "target":  # a target cancels any velocity at its boundary
            self.velocity = list(_ZERO)
            self.camera_from = list(self.pose)
        else:
            self.camera_from = list(self.velocity)
        self.camera_mode, self.camera_goal = move.mode, goal
        self.camera_fade = _Fade(event_id, frames)
        self._pending_tracks[event_id].add("camera")

    def _prompt_layers(self, j: int | None) -> list[tuple[Scene, float]]:
        """The scenes and weights of frame ``j`` of this chunk (None: the last
        rendered frame)."""
        fade = self.prompt_fade
        if fade is None:
            return [(self.target, 1.0)]
        alpha = fade.reached if j is None else fade.alpha(j)
        return [(s, w * (1.0 - alpha)) for s, w in self.sources] + [(self.target, alpha)]

    def _camera_step(self, j: int) -> list[float]:
        """Advance the camera by one frame (frame ``j`` of this chunk); its pose."""
        fade = self.camera_fade
        alpha = 1.0 if fade is None else fade.alpha(j)
        start, goal = self.camera_from, self.camera_goal
        if self.camera_mode == "target" and fade is not None:
            self.pose = [s + (g - s) * alpha for s, g in zip(start, goal, strict=True)]
        elif self.camera_mode == "velocity":
            self.velocity = [s + (g - s) * alpha for s, g in zip(start, goal, strict=True)]
            self.pose = [p + v for p, v in zip(self.pose, self.velocity, strict=True)]
        return list(self.pose)

    def end_chunk(self, n_frames: int) -> None:
        """Advance the fades by ``n_frames`` and record the chunk's events."""
        events, self._next_events = self._next_events, ChunkEvents()
        for track in ("prompt", "camera"):
            fade = self.prompt_fade if track == "prompt" else self.camera_fade
            if fade is None:
                continue
            if fade.event_id in self._pending_tracks:
                events.active.append(fade.event_id)
            fade.done += n_frames
            if fade.reached >= 1.0:
                self._finish(fade.event_id, track, events)
                if track == "prompt":
                    self.prompt_fade, self.sources = None, []
                else:
                    self.camera_fade = None
                    if self.camera_mode == "target":
                        self.camera_mode = None
        events.active = list(dict.fromkeys(events.active))
        self.events = events
        self.frame_index += n_frames
        self.chunk_index += 1


def _merge_layers(layers: list[tuple[Scene, float]]) -> list[tuple[Scene, float]]:
    """Combine repeats of a prompt, drop invisible layers, keep the heaviest
    MAX_FADE_SOURCES and renormalise to a total weight of 1."""
    merged: dict[str, tuple[Scene, float]] = {}
    for scene, weight in layers:
        previous = merged.get(scene.prompt)
        merged[scene.prompt] = (scene, weight + (previous[1] if previous else 0.0))
    kept = sorted((item for item in merged.values() if item[1] >= MIN_LAYER_WEIGHT), key=lambda i: -i[1])[
        :MAX_FADE_SOURCES
    ]
    total = sum(w for _, w in kept) or 1.0
    return [(s, w / total) for s, w in kept]


def iter_chunk(state: RenderState, n_frames: int) -> Iterator[torch.Tensor]:
    """Render the next ``n_frames`` frames in batches of RENDER_BATCH_PIXELS:
    float32 RGB planes [b,3,H,W] in [0,1].

    Call ``state.apply(interactions)`` first to start this boundary's
    interactions; once the iterator is exhausted ``state.events`` describes
    the chunk. An iterator abandoned early leaves ``state`` unusable.
    """
    h, w = state.height, state.width
    batch = max(1, RENDER_BATCH_PIXELS // (h * w))
    gx, gy = state._grid
    for lo in range(0, n_frames, batch):
        js = range(lo, min(n_frames, lo + batch))
        poses = [state._camera_step(j) for j in js]
        times = [(state.frame_index + j) / state.fps for j in js]
        wx, wy = view_transform(poses, gx, gy)
        per_frame = [state._prompt_layers(j) for j in js]
        acc: torch.Tensor | None = None
        for index, (scene, _) in enumerate(per_frame[0]):
            weights = [layers[index][1] for layers in per_frame]
            if max(weights) < MIN_LAYER_WEIGHT:
                continue
            img = scene.render(times, wx, wy)
            if min(weights) < 1.0:
                img.mul_(torch.tensor(weights).view(-1, 1, 1, 1))
            acc = img if acc is None else acc.add_(img)
        assert acc is not None  # the target's weight is > 0 on every frame
        yield acc.clamp_(0.0, 1.0)
    state.end_chunk(n_frames)


def render_chunk(state: RenderState, n_frames: int) -> torch.Tensor:
    """Render the next ``n_frames`` frames: uint8 [n,H,W,3] (RGB).

    Call ``state.apply(interactions)`` first to start this boundary's
    interactions; afterwards ``state.events`` describes the chunk.
    """
    planes = torch.cat(list(iter_chunk(state, n_frames)))
    return planes.mul_(255.0).add_(0.5).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
