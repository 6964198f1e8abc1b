"""The NATS seam: the only package that imports nats. `Bus` (core NATS and JetStream
over typed wire models) and what its users handle: errors, deliveries, rejections."""

from antdt.runtime.bus.client import (
    Bus,
    BusError,
    Decoder,
    Delivery,
    DurableConsumer,
    Handler,
    Received,
    Rejected,
    Rejections,
    Replay,
    RequestRefused,
    StreamMissing,
    Subscription,
    WireModel,
    decode_reply,
    encode,
)

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
    "Subscription",
    "WireModel",
    "decode_reply",
    "encode",
]
