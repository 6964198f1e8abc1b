"""Simulation helpers: seeded, labelled traces (pure, imports only antdt.schemas)."""
