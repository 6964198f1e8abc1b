"""The NATS seam: the only package that imports nats. `Bus` (core NATS and JetStream
over typed wire models) and what its users handle: errors, deliveries, rejections."""

from antdt.runtime.bus.client import Bus
from antdt.runtime.bus.jetstream import DurableConsumer, Received
from antdt.runtime.bus.messages import (
    BusError,
    Decoder,
    Delivery,
    Handler,
    Rejected,
    Rejections,
    Replay,
    RequestRefused,
    StreamMissing,
    StreamUnanswered,
    decode_reply,
    encode,
)
from antdt.runtime.bus.subscription import Subscription

__all__ = [
    "Bus",
    "BusError",
    "Decoder",
    "Delivery",
    "DurableConsumer",
    "Handler",
    "Received",
    "Rejected",
    "Rejections",
    "Replay",
    "RequestRefused",
    "StreamMissing",
    "StreamUnanswered",
    "Subscription",
    "decode_reply",
    "encode",
]
