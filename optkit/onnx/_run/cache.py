"""JAX's persistent compilation cache, on by default for optkit's programs: :func:`compilation_cache`.

A second process (a restarted notebook, the next run of a training script, the evaluation after training) that
compiles the same program finds it in JAX's persistent compilation cache instead of compiling it again. JAX keeps
the cache off unless a directory is set; every load of a model (:func:`optkit.onnx.prepare`,
:func:`optkit.onnx.to_jax`, :class:`optkit.onnx.OnnxModule`, the command line) turns it on in a bounded directory
under the user's cache, unless the user decided otherwise (below). Entries are keyed by JAX on the program, the
compile options, the backend and JAX's version; the directory is also per jax and jaxlib version, so that an
upgraded (or downgraded) jaxlib never reads another's executables.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys

import jax

__all__ = ["compilation_cache", "opted_out", "CACHE_MAX_BYTES", "CACHE_MIN_COMPILE_SECONDS", "OPT_OUT"]

_log = logging.getLogger("optkit.onnx")

CACHE_MAX_BYTES = 2**30  # the directory's bound: JAX evicts the least recently used entries past it
CACHE_MIN_COMPILE_SECONDS = 0.3  # programs that compile faster are not written (reading one costs about as much)
OPT_OUT = "OPTKIT_COMPILATION_CACHE"  # "off" (or 0, false, no): leave JAX's cache off; a path: the directory
_OFF = {"0", "off", "false", "no", "none"}
_state: dict[str, str | None] = {}


def compilation_cache() -> str | None:
    """Turn on JAX's persistent compilation cache for this process, as every model load does, and give its
    directory: ``<user cache>/optkit/jax-<jax version>-jaxlib-<jaxlib version>`` (``$XDG_CACHE_HOME`` or
    ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows), bounded to
    1 GiB (JAX evicts the least recently used entries) and holding the programs that took 0.3 s or more to
    compile.

    The user decides first; then nothing is changed:

    - ``OPTKIT_COMPILATION_CACHE=off`` (or ``0``, ``false``, ``no``) in the environment: the cache stays as JAX
      has it (off unless set); ``OPTKIT_COMPILATION_CACHE=<directory>``: that directory instead of the default;
    - a directory set already (``jax.config.update("jax_compilation_cache_dir", ...)`` or
      ``JAX_COMPILATION_CACHE_DIR``): it, with your bound and threshold, is used;
    - ``jax.config.update("jax_enable_compilation_cache", False)``: JAX's own switch, off.

    ``to_jax``'s warm starts keep ``apply_fn``'s exported forward and backward passes in its ``optkit-warm``
    folder (``optkit.onnx._run.warm``; docs "Warm starts"), and are off when the cache is.

    A directory that cannot be made or written leaves the cache off (logged at INFO on the ``optkit.onnx``
    logger). The first call decides, once per process. JAX's cache is trusted: do not point it at a
    directory others can write.

    Returns:
      The directory JAX's cache uses (the user's own included), or None when it is off.

    It raises nothing: a cache that cannot be used is left off.

    Source: JAX's persistent compilation cache (``jax_compilation_cache_dir``,
    ``jax_compilation_cache_max_size``, ``jax_persistent_cache_min_compile_time_secs``); docs "Compile once".

    Example:
      >>> import os, optkit.onnx
      >>> directory = optkit.onnx.compilation_cache()
      >>> directory is None or os.path.isdir(directory)
      True
    """
    if "directory" not in _state:
        _state["directory"] = _turn_on()
    return _state["directory"]


def opted_out() -> bool:
    """True where ``OPTKIT_COMPILATION_CACHE`` says off (``off``, ``0``, ``false``, ``no``, ``none``)."""
    return os.environ.get(OPT_OUT, "").strip().lower() in _OFF


def _turn_on() -> str | None:
    if not jax.config.jax_enable_compilation_cache:
        return None
    if jax.config.jax_compilation_cache_dir:  # the user's own directory and settings
        return str(jax.config.jax_compilation_cache_dir)
    choice = os.environ.get(OPT_OUT, "").strip()
    if choice.lower() in _OFF:
        _log.info("JAX's persistent compilation cache left off (%s=%s)", OPT_OUT, choice)
        return None
    import jaxlib

    directory = pathlib.Path(choice) if choice else (
        _user_cache() / "optkit" / f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        _log.info("JAX's persistent compilation cache left off: %s cannot be written (%s)", directory, err)
        return None
    if jax.config.jax_compilation_cache_max_size == -1:  # JAX's unbounded default
        jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    if jax.config.jax_persistent_cache_min_compile_time_secs == 1.0:  # JAX's default
        jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECONDS)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    _log.info("JAX's persistent compilation cache on in %s (%s=off to leave it off)", directory, OPT_OUT)
    return str(directory)


def _user_cache() -> pathlib.Path:
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return pathlib.Path(os.environ["LOCALAPPDATA"])
    if sys.platform == "darwin":
        return pathlib.Path.home() / "Library" / "Caches"
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
