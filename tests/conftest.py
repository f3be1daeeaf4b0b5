"""Shared pytest configuration: hypothesis profiles sized for a 2-core CI machine."""


import os

from hypothesis import HealthCheck, settings

# JAX traces and compiles on first call, so a single example can take far longer
# than hypothesis's default deadline; examples are few but each is a real check.
settings.register_profile(
    "ci",
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=100,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
