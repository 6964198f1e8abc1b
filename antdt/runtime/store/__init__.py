"""The etcd seam: the only package that imports the etcd client. `Store` and its
typed operations, errors and leases."""

from antdt.runtime.store.etcd import (
    Compare,
    Delete,
    Get,
    Lease,
    Op,
    Put,
    Store,
    StoreError,
    StoreUnavailable,
    Versioned,
    WatchEvent,
    retrying,
)

__all__ = [
    "Compare",
    "Delete",
    "Get",
    "Lease",
    "Op",
    "Put",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Versioned",
    "WatchEvent",
    "retrying",
]
