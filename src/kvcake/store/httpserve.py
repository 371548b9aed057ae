"""Serve a FastAPI app with uvicorn on a background thread (the master and store-server are
threaded processes; their HTTP is a side door for admin, health and metrics)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class HttpThread:
    """``h = HttpThread(app, "127.0.0.1", 0); h.start(); h.address; h.stop()``. The socket is
    bound in the constructor, so a busy port fails there with OSError and ``address`` is
    known before the server runs."""

    def __init__(self, app: Any, host: str, port: int, name: str = "http"):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.listen(128)
        cfg = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, name=name, daemon=True
        )

    @property
    def address(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{host}:{port}"

    def start(self, timeout: float = 10.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started and self.thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError("HTTP server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        self.sock.close()
