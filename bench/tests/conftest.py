"""The bench's tests run against the test suite's servers: one real nats-server and etcd
for the session (tests/conftest.py)."""

pytest_plugins = ["tests.conftest"]
