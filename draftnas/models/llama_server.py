"""`llama-server`, the stock build's server, as a context manager: started on a free local port with a
model and flags, ready when its health check says so, stopped (and its log removed) on exit; `complete`
sends token ids and returns the server's JSON (tokens, timings, drafted and accepted counts)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from draftnas.models.llama_cpp import LlamaCpp, LlamaCppError, last_lines, server_flags


class Server:
    """One `llama-server` process serving `model` (with `flags`: a drafter, lookup settings), named `name`
    in its messages, on a free local port, stopped on exit."""

    def __init__(self, llama: LlamaCpp, name: str, model: Path, flags: Sequence[str], threads: int,
                 context: int) -> None:
        self.name, self.port = name, _free_port()
        args = [
            "-m",
            str(model),
            "-t",
            str(threads),
            "-c",
            str(context),
            "-np",
            "1",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *server_flags(llama.flags),
            *flags,
        ]
        self.log = tempfile.NamedTemporaryFile(
            "w+", prefix=f"draftnas-llama-server-{name}-", suffix=".log", delete=False
        )
        self.command = [str(llama.tool("llama-server")), *args]
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self) -> Server:
        try:
            return self._ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _ready(self) -> Server:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LlamaCppError(
                    f"llama-server for {self.name} exited {self.process.returncode}: "
                    f"{self.log_tail()} (command: {' '.join(self.command)})"
                )
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if json.load(r).get("status") == "ok":
                        return self
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.5)
        raise LlamaCppError(
            f"llama-server for {self.name} was not ready in 300 s: {self.log_tail()}"
        )

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()
        os.unlink(self.log.name)

    def log_tail(self) -> str:
        return last_lines(Path(self.log.name).read_text(errors="replace"), 3)

    def complete(self, ids: Sequence[int], n_predict: int, seed: int) -> dict[str, Any]:
        body = {
            "prompt": list(ids),
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": False,
            "seed": seed,
            "return_tokens": True,
            "stream": False,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=600) as r:
            return dict(json.load(r))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
