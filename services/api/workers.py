"""API worker processes: N of them serve one port, each with SO_REUSEPORT, so the kernel
spreads connections over them; each keeps its own read models, fed by its own consumer group
(services/api/settings.py `bus_group`). What must hold across workers is in the database: the
log (idempotency, optimistic concurrency), tokens, and the teams' submission buckets. A worker
that exits takes the others down with it, so that whatever restarts the API (the launcher's
supervisor, compose's restart policy) starts all of them afresh.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from services.api.app import create_app
from services.api.coalesce import CoalescingHttpToolsProtocol
from services.api.settings import ApiSettings

log = logging.getLogger("services.api")

# After a signal, how long the workers may take to stop by themselves (the signal reached
# them too) before they are sent one, and how long that may take before they are killed: the
# whole stays below the launcher's 15 s before its SIGKILL.
OWN_STOP_S = 3.0
STOP_GRACE_S = 10.0
# prctl(2): the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def listening_socket(host: str, port: int, *, shared: bool) -> socket.socket:
    """A listening socket on (host, port); `shared`: one that the other workers may bind too
    (alone, an address already in use is an error, as it always was)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def server_config(app: ASGIApp, **options: Any) -> uvicorn.Config:
    """How every API worker serves `app`: request heads bounded (runtime/request_head.py) and
    an answer's head and body in one send (services/api/coalesce.py)."""
    return uvicorn.Config(
        app,
        http=CoalescingHttpToolsProtocol,
        # Every change is already an event in the log; a line per request would cost a tenth of
        # the API's throughput for no new information.
        access_log=False,
        proxy_headers=False,
        **options,
    )


def serve(settings: ApiSettings, *, shared: bool = False) -> None:
    config = server_config(create_app(settings, settle=True), log_level="info")
    server = uvicorn.Server(config)
    sock = listening_socket(settings.listen_host, settings.listen_port, shared=shared)
    server.run(sockets=[sock])


def _worker(index: int) -> None:
    _stop_with_parent()
    os.environ["GANGWAY_API_WORKER"] = str(index)
    configure_logging(f"api-{index}")
    serve(ApiSettings(), shared=True)


def run_workers(count: int) -> int:
    """Start `count` workers, wait until one exits or a signal comes, stop them all."""
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_worker, args=(index,), name=f"api-{index}")
        for index in range(1, count + 1)
    ]
    for process in workers:
        process.start()
    log.info("%d API workers started: %s", count, ", ".join(str(p.pid) for p in workers))
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping and all(process.is_alive() for process in workers):
        time.sleep(0.2)
    failed = [p for p in workers if not p.is_alive() and p.exitcode not in (0, None)]
    if stopping:
        # A signal to the process group (the launcher's, a terminal's Ctrl-C) reached the
        # workers too; a second SIGTERM would make uvicorn skip its graceful stop.
        _join_all(workers, OWN_STOP_S)
    for process in workers:
        if process.is_alive():
            process.terminate()  # SIGTERM: uvicorn finishes its requests and shuts down
    deadline = time.monotonic() + STOP_GRACE_S
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
    if failed and not stopping:
        log.error(
            "API worker %s exited (%s); stopped the others", failed[0].name, failed[0].exitcode
        )
        return 1
    return 0


def _join_all(workers: Sequence[multiprocessing.process.BaseProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for process in workers:
        process.join(max(0.0, deadline - time.monotonic()))


def _stop_with_parent() -> None:
    """SIGTERM this worker when its parent dies, however (a SIGKILL included): a worker left
    behind would keep serving the port with nobody watching it."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def configure_logging(name: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s {name} %(name)s %(message)s"
    )
