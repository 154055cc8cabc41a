"""API worker processes: N of them serve one port, each with SO_REUSEPORT, so the kernel
spreads connections over them; each keeps its own read models, fed by its own consumer group
(services/api/settings.py `bus_group`). What must hold across workers is in the database: the
log (idempotency, optimistic concurrency), tokens, and the teams' submission buckets. A worker
that exits takes the others down with it, so that whatever restarts the API (the launcher's
supervisor, compose's restart policy) starts all of them afresh.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import time
from types import FrameType

import uvicorn

from services.api.app import create_app
from services.api.settings import ApiSettings

log = logging.getLogger("services.api")

# How long stopping workers may take before they are killed.
STOP_GRACE_S = 15.0


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other workers may bind too."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(settings: ApiSettings) -> None:
    config = uvicorn.Config(
        create_app(settings),
        log_level="info",
        # Every change is already an event in the log; a line per request would cost a tenth of
        # the API's throughput for no new information.
        access_log=False,
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[reuse_port_socket(settings.listen_host, settings.listen_port)])


def _worker(index: int) -> None:
    os.environ["GANGWAY_API_WORKER"] = str(index)
    configure_logging(f"api-{index}")
    serve(ApiSettings())


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


def configure_logging(name: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s %(levelname)s {name} %(name)s %(message)s"
    )
