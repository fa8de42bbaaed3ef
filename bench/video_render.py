"""CPU video throughput: render and encode frames on ONE thread.

Measures the embedded ``cpu-video`` engine's per-frame work at a size and
rate (default 256x256 at 12 fps, half-second chunks), separately and
together, in steady state and during a prompt transition (two scenes blended
per frame), and prints how many real-time sessions one core sustains::

    python bench/video_render.py
    python bench/video_render.py --width 512 --height 288 --fps 24 --seconds 5

One thread: ``torch.set_num_threads(1)`` and x264 ``threads=1``, as the
engine runs one chunk per worker thread. Rates are frames per CPU second of
the process, so a busy machine slows the run but not the figures (shared
caches still do). Sessions per core is fps(render+encode) / requested fps,
rounded down; it ignores the event loop's and socket's own work, so treat it
as an upper bound.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from orchestrator.engines.video.encode import Fmp4Encoder, JpegEncoder
from orchestrator.engines.video.render import RenderState, iter_chunk
from orchestrator.video_engine import Interaction, default_frames_per_chunk

PROMPT = "A serene lakeside sunrise with mist over the water"


def frames_per_second(step: Callable[[], int], seconds: float) -> float:
    """Frames per CPU second of this process: run ``step`` (returns frames
    done) for ``seconds`` of wall time after one warm-up call. CPU time, not
    wall time, so that other load on the machine does not count against us
    (one thread: the process's CPU time is that thread's)."""
    step()
    done, wall, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        done += step()
    return done / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--fps", type=int, default=12)
    parser.add_argument("--frames-per-chunk", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    args = parser.parse_args()
    torch.set_num_threads(1)
    w, h, fps = args.width, args.height, args.fps
    per_chunk = args.frames_per_chunk or default_frames_per_chunk(fps)

    def render_only(state: RenderState) -> Callable[[], int]:
        def step() -> int:
            for _ in iter_chunk(state, per_chunk):
                pass
            return per_chunk

        return step

    def render_and_encode(state: RenderState, encoder: Fmp4Encoder | JpegEncoder) -> Callable[[], int]:
        def step() -> int:
            for planes in iter_chunk(state, per_chunk):
                encoder.encode(planes)
            encoder.flush_chunk()
            return per_chunk

        return step

    def fading(state: RenderState) -> RenderState:
        # A fade far longer than the measurement: every frame blends two scenes.
        state.apply([Interaction("bench", prompt="A sea turtle glides past the reeds", transition_chunks=1000)])
        return state

    def new_state() -> RenderState:
        return RenderState(PROMPT, w, h, fps, per_chunk)

    # Encoding alone gets two seconds of real frames, cycled: the same frame
    # over and over would make every P-frame trivially cheap.
    source = new_state()
    chunks = [torch.cat(list(iter_chunk(source, per_chunk))) for _ in range(max(1, 2 * fps // per_chunk))]
    h264 = Fmp4Encoder(w, h, fps, per_chunk)
    jpeg = JpegEncoder(w, h, fps)

    def encode_only(encoder: Fmp4Encoder | JpegEncoder) -> Callable[[], int]:
        position = 0

        def step() -> int:
            nonlocal position
            planes = chunks[position % len(chunks)]
            position += 1
            encoder.encode(planes)
            encoder.flush_chunk()
            return planes.shape[0]

        return step

    s = args.seconds
    rows = [
        ("render", frames_per_second(render_only(new_state()), s)),
        ("render, during a transition", frames_per_second(render_only(fading(new_state())), s)),
        ("encode H.264 fMP4", frames_per_second(encode_only(h264), s)),
        ("encode JPEG", frames_per_second(encode_only(jpeg), s)),
        ("render + encode H.264", frames_per_second(render_and_encode(new_state(), h264), s)),
        (
            "render + encode H.264, during a transition",
            frames_per_second(render_and_encode(fading(new_state()), Fmp4Encoder(w, h, fps, per_chunk)), s),
        ),
        ("render + encode JPEG", frames_per_second(render_and_encode(new_state(), jpeg), s)),
    ]
    print(f"cpu-video, {w}x{h} at {fps} fps, {per_chunk} frames per chunk, one thread ({h264.codec})")
    for name, value in rows:
        line = f"  {name:44s} {value:8.1f} frames/s"
        if name.startswith("render +"):
            line += f"  -> {int(value // fps):3d} real-time sessions per core ({value / fps:.1f}x real time)"
        print(line)


if __name__ == "__main__":
    main()
