"""The etcd seam: the only package that imports the etcd client. `Store` and its
typed operations, errors and leases."""

from antdt.runtime.store.auth import EtcdUser, enable_auth
from antdt.runtime.store.decoding import (
    StoredValueInvalid,
    decode_object,
    decode_stored,
    decode_text,
)
from antdt.runtime.store.etcd import Store, retrying
from antdt.runtime.store.lease import Lease
from antdt.runtime.store.values import (
    Compare,
    Delete,
    Get,
    HistoryCompacted,
    Op,
    Put,
    StoreError,
    StoreUnavailable,
    Versioned,
    WatchEvent,
)

__all__ = [
    "Compare",
    "Delete",
    "EtcdUser",
    "Get",
    "HistoryCompacted",
    "Lease",
    "Op",
    "Put",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StoredValueInvalid",
    "Versioned",
    "WatchEvent",
    "decode_object",
    "decode_stored",
    "decode_text",
    "enable_auth",
    "retrying",
]
