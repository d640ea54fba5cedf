"""The search's work on a Ray cluster: one actor per worker, each holding the instance.

:class:`RayRunner` is a :class:`~pipette_cp.search.executors.workers.Runner`: ``jobs`` actors are
started with the instance, the method and the layouts (put in the object store once),
work goes to the least busy actor, and each call's result comes back as a
``concurrent.futures.Future`` (Ray's ``ObjectRef.future()``), so the search's phases
run unchanged.  The incumbent stays with the search, which prunes a layout before
handing it out.  An actor that dies (its node lost, the process killed) raises
``RayActorError`` in its futures: the search restarts the actors and retries the
layouts in flight once.

Ray connects to ``address`` (``host:port`` of a running cluster, checked reachable
first), else to ``RAY_ADDRESS`` if set, else starts a local Ray with ``jobs`` CPUs; a
Ray already initialised in this process is used as it is.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

from pipette_cp.errors import SpecError
from pipette_cp.search.executors import workers
from pipette_cp.specs import Instance, Plan

#: Seconds to wait for a TCP connection to a given Ray address, and for its answer.
CONNECT_TIMEOUT_S = 3.0
#: An HTTP/2 client's opening (RFC 9113, section 3.4: the preface, then an empty
#: SETTINGS frame).  Ray's GCS and Ray Client ports are gRPC servers, which speak
#: HTTP/2 and answer with a SETTINGS frame of their own.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))
#: Frame type of SETTINGS (RFC 9113, section 6.5).
_SETTINGS = 4


def import_ray() -> Any:
    """The ``ray`` module, or a one-line error saying how to get it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise SpecError(
            "--executor", "ray", "Ray is not installed; install pipette-cp[ray]"
        ) from None


def check_address(address: str, field: str = "ray_address") -> str:
    """``address`` (``host:port``, or ``ray://host:port``) if a server there answers an
    HTTP/2 opening with a SETTINGS frame, as Ray's gRPC ports do, within
    :data:`CONNECT_TIMEOUT_S`; else a SpecError naming ``field`` (no connection, or a
    server that is not Ray's: silent, or speaking another protocol)."""
    bare = address.removeprefix("ray://")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit():
        raise SpecError(field, address, "expected host:port of a running Ray cluster")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(CONNECT_TIMEOUT_S)
            sock.sendall(_HTTP2_PREFACE)
            answer = _read(sock, 9)  # a frame header: length (3), type, flags, stream (4)
    except TimeoutError:
        raise SpecError(field, address, f"accepts connections but says nothing within "
                        f"{CONNECT_TIMEOUT_S:g} s: not a Ray cluster's address") from None  # fmt: skip
    except OSError as exc:
        raise SpecError(field, address, f"cannot be reached ({exc.strerror or exc})") from None
    if len(answer) < 9 or answer[3] != _SETTINGS:
        raise SpecError(field, address, "answers, but not as Ray's gRPC server does: not a "
                        "Ray cluster's address (the GCS port, 6379 by default, or ray://host:10001)")  # fmt: skip
    return address


def _read(sock: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes, fewer when the peer closes first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


class _Worker:
    """One actor: the worker state of :mod:`~pipette_cp.search.executors.workers`."""

    def __init__(self, instance: Instance, method: str, layouts: Sequence[Plan]) -> None:
        workers._init(instance, method, layouts)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


@contextlib.contextmanager
def _own_stop_handlers() -> Iterator[None]:
    """Keep this process's SIGTERM, SIGHUP and SIGINT handlers across the block:
    ``ray.init`` installs a SIGTERM handler that ends the driver at once, and the
    command's own stops Ray's work as Ctrl-C does, keeping the best plan."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            if handler is not None:
                signal.signal(signum, handler)


class RayRunner:
    """``jobs`` Ray actors (see the module docstring)."""

    def __init__(
        self, instance: Instance, method: str, layouts: Sequence[Plan], jobs: int,
        address: str | None = None,
    ) -> None:  # fmt: skip
        self.ray = import_ray()
        self.jobs = jobs
        self.shares_cores = False  # actors may be on other machines, one core each
        if not self.ray.is_initialized():
            with _own_stop_handlers():
                self._init_ray(address, jobs)
        self.lost: tuple[type[BaseException], ...] = (self.ray.exceptions.RayActorError,)
        self._refs = (self.ray.put(instance), method, self.ray.put(list(layouts)))
        self._actor = self.ray.remote(num_cpus=1)(_Worker)
        self._start()

    def _init_ray(self, address: str | None, jobs: int) -> None:
        if address is not None:
            self.ray.init(address=check_address(address), log_to_driver=False)
        elif os.environ.get("RAY_ADDRESS"):
            self.ray.init(log_to_driver=False)
        else:
            self.ray.init(num_cpus=jobs, include_dashboard=False, log_to_driver=False)

    def _start(self) -> None:
        """Start the actors and wait until each holds its state (their start-up, a
        Python with the package imported, belongs to no layout's time share)."""
        self._actors = [self._actor.remote(*self._refs) for _ in range(self.jobs)]
        self._busy = [0] * self.jobs
        self.ray.get([actor.run.remote(len, ()) for actor in self._actors])

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        k = min(range(self.jobs), key=self._busy.__getitem__)
        self._busy[k] += 1
        future: Future = self._actors[k].run.remote(fn, *args).future()

        def done(_: Future, k: int = k) -> None:
            self._busy[k] -= 1

        future.add_done_callback(done)
        return future

    def restart(self) -> None:
        """Kill every actor and start new ones."""
        for actor in self._actors:
            self.ray.kill(actor)
        self._start()

    def close(self, abort: bool = False) -> None:
        del abort  # the actors' work ends with them either way
        for actor in self._actors:
            self.ray.kill(actor)
        self._actors = []
