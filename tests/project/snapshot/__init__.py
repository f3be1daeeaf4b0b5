"""The bit-identity snapshot: optkit's numbers at one revision, recomputed by tests/project/test_snapshot.py."""
