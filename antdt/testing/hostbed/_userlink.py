"""A slow link in user space, for kernels without netem: run in the switch namespace as
`python _userlink.py PORT TAP DELAY_MS JITTER_MS RATE_MBIT` (rate 0: unlimited).

It makes tap TAP (for the bridge) and carries every frame between the veth end PORT and
TAP, each direction delayed by DELAY_MS (+- JITTER_MS, never reordered) and paced to
RATE_MBIT. Frames keep their offload header (virtio-net), so large TCP segments and
unfinished checksums pass as the kernel made them. Prints "ready"; dies with its parent."""

import collections
import contextlib
import fcntl
import os
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

TUNSETIFF, TUNSETOFFLOAD = 0x400454CA, 0x400454D0
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x01, 0x02, 0x04
SOL_PACKET, PACKET_VNET_HDR, ETH_P_ALL = 263, 15, 0x0003
VNET_HDR_LEN = 10
#: Read buffer: a whole offloaded TCP segment (64 KiB) with its headers.
MAX_FRAME = 1 << 17


def open_tap(name: str) -> int:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), flags))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)
    return fd


def open_port(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.bind((name, ETH_P_ALL))
    return sock


class Direction:
    """Frames in flight one way: each leaves at max(arrival + delay, the previous one's
    departure, the time the paced link is free again)."""

    def __init__(
        self, send: Callable[[bytes], object], delay_s: float, jitter_s: float, rate_bps: float
    ) -> None:
        self.send, self.delay_s, self.jitter_s, self.rate_bps = send, delay_s, jitter_s, rate_bps
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.last_due = 0.0
        threading.Thread(target=self.drain, daemon=True).start()

    def carry(self, frame: bytes) -> None:
        jitter = random.uniform(-self.jitter_s, self.jitter_s) if self.jitter_s else 0.0
        with self.ready:
            self.last_due = max(time.monotonic() + self.delay_s + jitter, self.last_due)
            self.queue.append((self.last_due, frame))
            self.ready.notify()

    def drain(self) -> None:
        free_at = 0.0
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                due, frame = self.queue.popleft()
            due = max(due, free_at)
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if self.rate_bps:
                on_wire_s = 8 * (len(frame) - VNET_HDR_LEN) / self.rate_bps
                free_at = max(due, time.monotonic()) + on_wire_s
            with contextlib.suppress(OSError):  # the link is cut (down): the frame is lost
                self.send(frame)


def main(port: str, tap: str, delay_ms: str, jitter_ms: str, rate_mbit: str) -> None:
    tap_fd, sock = open_tap(tap), open_port(port)
    delay_s, jitter_s = float(delay_ms) / 1e3, float(jitter_ms) / 1e3
    rate_bps = float(rate_mbit) * 1e6
    to_bridge = Direction(lambda frame: os.write(tap_fd, frame), delay_s, jitter_s, rate_bps)
    to_host = Direction(sock.send, delay_s, jitter_s, rate_bps)

    def from_bridge() -> None:
        while True:
            to_host.carry(os.read(tap_fd, MAX_FRAME))

    threading.Thread(target=from_bridge, daemon=True).start()
    print("ready", flush=True)
    while True:
        frame, address = sock.recvfrom(MAX_FRAME)
        if address[2] != socket.PACKET_OUTGOING:
            to_bridge.carry(frame)


if __name__ == "__main__":
    main(*sys.argv[1:6])
