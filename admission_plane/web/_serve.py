"""Run the application with uvicorn until SIGINT or SIGTERM, then shut down gracefully.

On the signal the server stops accepting connections, every dashboard stream ends within
a second (so no open page holds the shutdown up), requests in flight finish (for at most
:data:`GRACEFUL_SECONDS`), and the caller closes the plane.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from ._snapshot import Hub

GRACEFUL_SECONDS = 5


class _Server(uvicorn.Server):
    """uvicorn's server, which also ends the dashboard streams on a signal and names its address once bound."""

    def __init__(self, config: uvicorn.Config, hub: Hub, announce: Callable[[str, int], None]) -> None:
        super().__init__(config)
        self._hub = hub
        self._announce = announce

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._hub.request_stop()
        super().handle_exit(sig, frame)
        # uvicorn raises the signal again after its shutdown, which would kill the process before the
        # command closes the plane; a signal that asked for a graceful stop has been honoured instead.
        self._captured_signals.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in self.servers:
            for bound in server.sockets:
                host, port = bound.getsockname()[:2]
                self._announce(str(host), int(port))
                return


def run(app: Any, host: str, port: int, announce: Callable[[str, int], None] | None = None) -> None:
    """Serve ``app`` on ``host:port`` (``port`` 0: any free port, announced) until a signal."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SECONDS,
        proxy_headers=False,
        server_header=False,
    )

    def default(bound_host: str, bound_port: int) -> None:
        print(f"serving http://{bound_host}:{bound_port}/", file=sys.stderr, flush=True)

    _Server(config, app.state.hub, announce or default).run()
    asyncio.set_event_loop(None)
