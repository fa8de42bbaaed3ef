"""A caller in a process of its own, so that a test can make it vanish (SIGKILL: no DTLS
close, no SCTP abort, no more packets). Prints its offer as a JSON line, reads the answer
as one, then sends silence as its microphone until killed."""

from __future__ import annotations

import asyncio
import json
import sys

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import AudioStreamTrack

from gateway.transport.webrtc.peer import gather_on


async def main() -> None:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.createDataChannel("oai-events")
    pc.addTrack(AudioStreamTrack())
    with gather_on(("127.0.0.1",)):  # on loopback, as every test's media (rtc_support.LOOPBACK)
        await pc.setLocalDescription(await pc.createOffer())
    print(json.dumps({"sdp": pc.localDescription.sdp}), flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await pc.setRemoteDescription(RTCSessionDescription(sdp=json.loads(line)["sdp"], type="answer"))
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
