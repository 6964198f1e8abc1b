"""The policy simulator (closed loop over the real cores: `simulate`) and the seeded
trace generator the detector's tests use (`traces`, `scenarios`)."""
