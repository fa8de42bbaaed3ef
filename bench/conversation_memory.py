"""What a conversation item costs in memory: a voice session's turns, in one process.

A conversation grows, by design, up to its bounds (``max_conversation_items``,
``max_conversation_bytes``; docs/settings.md, *Limits*), so a long session's memory is
mostly its conversation. This builds one ``RealtimeSession`` (Sans-I/O, no
sockets, no engine) and plays ``--turns`` turns into it, each as
``bench/voice_load.py --duplex`` plays them: a user message of ``--user-chars``
characters (a transcript's size), then an answer of ``--answer-s`` seconds of
20 ms audio deltas with a transcript word every ``--words-every`` deltas. Each
audio delta and event is taken and dropped, as the host would after sending it.

It prints the Python heap (``tracemalloc``) per user item and per answer, what
``max_conversation_bytes`` counts of each, and so how large a session at the
default bounds grows.

    python bench/conversation_memory.py           # ~5 s
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import orjson

from gateway.protocol import client_events as ce
from gateway.protocol.session_config import SessionConfig
from gateway.session.session import RealtimeSession, SessionLimits
from gateway.settings import Settings
from orchestrator.engine import AudioDelta, Finished, TextDelta, Usage
from orchestrator.engines.passthrough import PassthroughEngine

CHUNK = b"\0" * 960  # 20 ms of 24 kHz PCM16


def session() -> RealtimeSession:
    s = RealtimeSession(
        session_id="sess_bench",
        config=SessionConfig(model="m", turn_detection=None),
        engine=PassthroughEngine().info,
        limits=SessionLimits(max_items=10**9, max_conversation_bytes=1 << 62),  # nothing deleted
    )
    s.start()
    s.take()
    return s


def user_turn(s: RealtimeSession, chars: int) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * chars}]}
    s.handle(ce.decode(orjson.dumps({"type": "conversation.item.create", "item": item})))
    s.take()


def answer(s: RealtimeSession, chunks: int, words_every: int) -> None:
    s.handle(ce.decode(orjson.dumps({"type": "response.create"})))
    events, _ = s.take()
    rid = next(e["response"]["id"] for e in events if e["type"] == "response.created")
    for i in range(chunks):
        if i % words_every == 0:
            s.on_response(rid, TextDelta(f" {i // words_every + 1}"))
        s.on_response(rid, AudioDelta(CHUNK))
        s.take()
    s.on_response(rid, Finished(usage=Usage(output_text_tokens=chunks // words_every)))
    s.take()


def heap() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=300)
    p.add_argument("--user-chars", type=int, default=190, help="each user message (default 190)")
    p.add_argument("--answer-s", type=float, default=5.0, help="seconds of audio per answer (default 5)")
    p.add_argument("--words-every", type=int, default=5, help="audio deltas per transcript word (default 5)")
    args = p.parse_args()
    chunks = int(args.answer_s * 50)
    s = session()
    for _ in range(5):  # first-use caches before the baseline
        user_turn(s, args.user_chars)
        answer(s, chunks, args.words_every)
    tracemalloc.start()
    base = heap()
    for _ in range(args.turns):
        user_turn(s, args.user_chars)
    users = heap()
    for _ in range(args.turns):
        answer(s, chunks, args.words_every)
    answers = heap()
    tracemalloc.stop()
    per_user, per_answer = (users - base) / args.turns, (answers - users) / args.turns
    items = list(s.conversation)
    user_counted = next(it for it in reversed(items) if it.role == "user").counted_bytes()
    last = next(it for it in reversed(items) if it.role == "assistant")
    marks = len(last.content[0].marks)
    answer_counted = last.counted_bytes()
    defaults = Settings()
    n_items = defaults.max_conversation_items
    pair_heap, pair_counted = per_user + per_answer, user_counted + answer_counted
    at_bound = min(n_items / 2, defaults.max_conversation_bytes / pair_counted) * pair_heap
    print(f"conversation_memory: {args.turns} turns of a {args.user_chars}-character user message and a "
          f"{args.answer_s:g} s answer (a word every {args.words_every} of {chunks} audio deltas)")  # fmt: skip
    print(f"  user item:   {per_user:8.0f} B heap, {user_counted:6d} B counted")
    print(f"  answer item: {per_answer:8.0f} B heap, {answer_counted:6d} B counted ({marks} marks)")
    print(f"  a session at the default bounds ({n_items} items, {defaults.max_conversation_bytes >> 20} MiB): "
          f"{at_bound / 2**20:.2f} MiB of conversation heap")  # fmt: skip


if __name__ == "__main__":
    main()
