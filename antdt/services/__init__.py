"""The control-plane services. They never import each other; they talk over NATS."""
