"""Run code and commands inside a Linux network namespace made by `ip netns add`.

A thread that enters a namespace (setns) makes its sockets there; the sockets stay in that
namespace when other threads use them, so a probe or a test's client needs no process."""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"


def netns_argv(netns: str | None) -> list[str]:
    """The prefix that runs a command in `netns` (none: in this process's namespace)."""
    return ["ip", "netns", "exec", netns] if netns else []


def in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """`fn()` run in a thread inside `netns` (None: here); its result or its exception."""
    if netns is None:
        return fn()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def enter_and_run() -> None:
        try:
            _enter(netns)
            outcome.append(fn())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=enter_and_run, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _enter(netns: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into {netns}: {os.strerror(errno)}")
    finally:
        os.close(fd)
