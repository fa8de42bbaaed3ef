"""A streamed video whose prompt changes midway (`/v1/realtime/video`, vLLM-Omni's
streaming video protocol): start a 3-second clip, send one interaction after the
first chunk, and write the fragmented MP4 to video.mp4 (or VIDEO_OUT). On the
embedded CPU engine the frames are drawn from the prompt: not a generative model.

The gateway: GATEWAY_URL (default ws://127.0.0.1:8000), its key if it needs one: GATEWAY_API_KEY.
"""

import asyncio
import json
import os
from pathlib import Path

from websockets.asyncio.client import connect

GATEWAY = os.environ.get("GATEWAY_URL", "ws://127.0.0.1:8000")
OUT = os.environ.get("VIDEO_OUT", "video.mp4")


async def stream() -> tuple[bytes, dict]:
    key = os.environ.get("GATEWAY_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else None
    start = {"type": "session.start", "prompt": "a red fox in snow", "width": 320, "height": 240, "fps": 12,
             "seconds": 3, "format": "m4s"}  # fmt: skip
    clip = bytearray()
    async with connect(GATEWAY + "/v1/realtime/video", additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps(start))
        async for message in ws:
            if isinstance(message, bytes):  # each chunk's bytes follow its metadata
                clip += message
                continue
            event = json.loads(message)
            if event["type"] == "video.chunk_metadata" and event["generation_chunk_index"] == 0:
                change = {"event_id": "evt_whale", "event": {"prompt": "a blue whale"}, "transition_chunks": 2}
                await ws.send(json.dumps({"type": "session.interaction", "interaction": change}))
            elif event["type"] == "video.chunk_metadata" and event["completed_event_ids"]:
                print("interaction applied:", ", ".join(event["completed_event_ids"]))
            elif event["type"] == "error":
                raise SystemExit(f"error: {event['code']}: {event['message']}")
            elif event["type"] == "session.done":
                return bytes(clip), event
    raise SystemExit("the gateway closed the stream before session.done")


clip, done = asyncio.run(stream())
Path(OUT).write_bytes(clip)
print(f"done: {done['chunks']} chunks, {len(clip)} bytes in {OUT}")
