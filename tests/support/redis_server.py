"""A private, throwaway redis-server for tests.

Tests must not touch a shared Redis: each run starts its own on a free port,
with no persistence (``--save "" --appendonly no``) in a temporary directory,
and kills it at teardown. ``restart()`` brings it back on the same port (empty,
as a real Redis without persistence would come back) for resilience tests.

Usage::

    with RedisServer() as server:
        store = create_store(server.url)

When the ``redis-server`` binary is missing, ``external_redis_url()`` returns
the ``REDIS_URL`` environment variable (or None), so CI without the binary can
still point the tests at a disposable Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from types import TracebackType

REDIS_BINARY = shutil.which("redis-server") or ""
START_TIMEOUT_S = 10.0  # how long to wait for the first PONG before giving up


def have_redis_server() -> bool:
    return bool(REDIS_BINARY)


def external_redis_url() -> str | None:
    return os.environ.get("REDIS_URL") or None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ping(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self._dir = tempfile.mkdtemp(prefix="redis-test-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if not REDIS_BINARY:
            raise RuntimeError("redis-server is not installed")
        if self.running:
            return
        with open(os.path.join(self._dir, "redis.log"), "ab") as logfile:
            self._proc = subprocess.Popen(
                [
                    REDIS_BINARY,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    self._dir,
                    "--daemonize",
                    "no",
                    "--protected-mode",
                    "no",
                ],
                stdout=logfile,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ping(self.port):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(os.path.join(self._dir, "redis.log"), "rb") as f:
                    tail = f.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{tail}")
            time.sleep(0.01)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()  # abrupt, like a crash; nothing is persisted anyway
        proc.wait(timeout=10)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, nothing answers."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)

    def log(self) -> str:
        """What the server logged so far (its warnings: a client closed for its output buffer, ...)."""
        with open(os.path.join(self._dir, "redis.log"), "rb") as f:
            return f.read().decode(errors="replace")

    def restart(self) -> None:
        """Stop and start again on the same port; the data is gone."""
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()
