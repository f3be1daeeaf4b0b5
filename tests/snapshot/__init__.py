"""The bit-identity snapshot: optkit's numbers at one revision, recomputed by tests/test_snapshot.py."""
