"""Shared plumbing. Import the submodules directly (`antdt.runtime.bus`, `.store`, ...):
this package imports nothing eagerly, so an agent image needs no etcd client."""
