"""A rolling deploy under load: what a listener hears while every replica is replaced.

A local cluster (``deploy/local_cluster.py``: redis-server, ``--replicas`` passthrough
gateways, nginx round-robin with no sticky sessions) serves ``--sessions`` Python SDK
sessions asking for answer after answer (1 s passthrough answers of 50 words and 20 ms
audio deltas, paced, no pause between them). Each replica in turn is sent SIGTERM (a
drain; ``--kill``: SIGKILL, a crash), waited for, and started again on its port, then the
next, ``--rounds`` times over. The driver (``tests/support/rolling.py``) checks every
answer (every word and audio byte, in order) and prints:

- answers whole, re-issued, and cut (by ``gateway_reason``: ``drained`` when a drain window
  ran out, ``replica_lost`` after a crash);
- failures: silence (no answer within 60 s), seq gaps or repeats, bad answers, errors,
  failed resumes (all must be 0);
- lost answers (never completed) and incomplete ones (cut, and their re-issue never completed),
  and the event gap p99 (the largest silence per session, below), in one line;
- the SDK's counts (resumes, resyncs, replayed events, duplicates dropped);
- the **largest silence per session**, p50/p99/max: the longest wait for the next audio
  delta while asking (target with SIGTERM: p99 <= 200 ms);
- how long each replica took from the signal to its exit (a drain hands each session over
  at its own first idle moment, paced).
- the silences of 100 ms or more, by what they coincided with: the session's own handover
  (it changed socket within it), a replica starting (spawn to ready), or neither (the load
  itself), and the most sessions silent at one moment (many at once: a stall they share).

Exit status 1 if anything failed, or (SIGTERM) an answer was cut by a drain.

    python bench/rolling_deploy.py                         # 3 replicas, 60 sessions, 2 rounds: ~1 min
    python bench/rolling_deploy.py --kill                  # the same with SIGKILL: nothing lost
    python bench/rolling_deploy.py --kill-rounds 1         # 2 SIGTERM rounds, then a SIGKILL round
    python bench/rolling_deploy.py --sessions 20 --rounds 1
    python bench/rolling_deploy.py --baseline 60           # no deploy: the load's own silences
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))

from support.rolling import API_KEY, rolling_deploy, summary  # noqa: E402

from deploy.local_cluster import Cluster  # noqa: E402


async def main(args: argparse.Namespace) -> int:
    env = {"OMNI_GATEWAY_VIDEO_ENGINE": "none", "OMNI_GATEWAY_DRAIN_WINDOW_S": str(args.window)}
    sig = signal.SIGKILL if args.kill else signal.SIGTERM
    async with Cluster(replicas=args.replicas, engine="passthrough", api_keys=(API_KEY,), env=env,
                       keep_run_dir=args.keep) as cluster:  # fmt: skip
        print(f"cluster up: {args.replicas} replicas behind {cluster.url} (run dir {cluster.run_dir})")
        began, cpu = time.monotonic(), time.process_time()
        rounds = 0 if args.baseline else args.rounds
        report = await rolling_deploy(cluster, sessions=args.sessions, rounds=rounds, sig=sig,
                                      warm_up_s=args.baseline or 2.0, plain=args.plain,
                                      kill_rounds=0 if args.baseline else args.kill_rounds)  # fmt: skip
        elapsed, cpu = time.monotonic() - began, time.process_time() - cpu
    what = ("no deploy (--baseline)" if args.baseline
            else f"{args.rounds} rounds of rolling {sig.name}, drain window {args.window:g} s"
            + (f", then {args.kill_rounds} of SIGKILL" if args.kill_rounds else ""))  # fmt: skip
    print(f"{args.sessions} sessions, {args.replicas} replicas, {what}, {elapsed:.0f} s:")
    for line in summary(report):
        print("  " + line)
    # The clients share the machine: a saturated client process stretches every silence it measures.
    print(f"  the clients' process: {100 * cpu / elapsed:.0f} % of a core; load average {os.getloadavg()[0]:.1f}")
    failed = report.bad or (sig == signal.SIGTERM and report.counts["cut_drained"])
    return 1 if failed else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--sessions", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--window", type=float, default=20.0, help="drain_window_s of every replica (default 20)")
    p.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM: crashes, not drains")
    p.add_argument(
        "--kill-rounds",
        type=int,
        default=0,
        metavar="N",
        help="after the rounds, N more rounds of SIGKILL in the same run (issue 34's roll: 2 SIGTERM "
        "rounds, then 1 SIGKILL round)",
    )
    p.add_argument("--baseline", type=float, default=0.0, metavar="S",
                   help="no deploy: the same sessions for S seconds, so that the largest silence the load "
                   "alone gives stands beside a deploy's")  # fmt: skip
    p.add_argument(
        "--plain",
        action="store_true",
        help="reconnect on plain sockets (a session opened at connect, replaced by the resume), "
        "as clients of other SDKs do; default: resume-only sockets (?resume=1)",
    )
    p.add_argument("--keep", action="store_true", help="keep the run directory (replica, nginx, redis logs)")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
