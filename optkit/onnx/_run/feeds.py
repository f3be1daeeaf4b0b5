"""Feeding a loaded model, for both runners: naming and checking the fed values, the dtype policy and the traced
graph function (its trace-time options: :mod:`optkit.onnx._base.tracing`).

:class:`~optkit.onnx.BackendRep` (``prepare``) and :class:`~optkit.onnx.OnnxFunction` (``to_jax``) are thin
siblings over this module: each names its feeds with :meth:`Feeds.named`, checks and converts them with
:meth:`Feeds.check`, and runs :func:`~optkit.onnx._run.program.graph_function`.

The dtype policy (docs page "ONNX models as JAX functions", "Integer and 64-bit types"): a declared ONNX type
runs as the dtype JAX gives it under the caller's 64-bit setting (``jax.dtypes.canonicalize_dtype``): with
``jax_enable_x64`` on, INT64 is int64 and DOUBLE float64, exactly ONNX's; with it off (JAX's default), INT64
runs as int32, UINT64 as uint32 and DOUBLE as float32. Nothing here switches the setting: a runner called
inside the caller's ``jax.jit`` traces in the caller's mode, and one called outside it runs in the same mode.
An integer feed of any integer dtype is converted to the input's dtype (``jax.jit`` with 64-bit mode off hands
int32 for an exporter's INT64 ``input_ids``); a concrete value that does not fit is refused, never wrapped.
A float, complex or bool feed must have the declared dtype (or, with 64-bit mode off, the one JAX runs it as):
ONNX converts nothing implicitly.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from optkit._src.graph.names import shape_text
from optkit.onnx._base.values import STRING, string_array

_log = logging.getLogger("optkit.onnx")

__all__ = ["Feeds", "run_dtype"]


# ------------------------------------------------------------------ the dtype policy

def run_dtype(declared: Any) -> np.dtype:
    """The dtype a declared ONNX type runs as under the caller's 64-bit setting (INT64 -> int32 with it off)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(declared))


def _mode_note(declared: np.dtype, wanted: np.dtype) -> str:
    return "" if wanted == declared else f" (run as {wanted}: JAX's 64-bit mode is off)"


class Feeds:
    """How a loaded model's graph inputs are fed: the one rule of both runners.

    Args:
      inputs: the graph inputs (:class:`~optkit.onnx.InputInfo` records), in ``graph.input`` order.
      static: the inputs whose values XLA needs before running (compiled once per value).
      double: the model has DOUBLE tensors (inputs, initializers or outputs): a call with JAX's 64-bit mode
        off warns, once, that they run as float32.
    """

    def __init__(self, inputs: Sequence[Any], static: frozenset[str], *, double: bool = False) -> None:
        self.inputs = tuple(inputs)
        self.static = static
        self._double = double
        self.by_name = {info.name: info for info in self.inputs}
        self._required = [info.name for info in self.inputs if not info.has_default]
        # Per input: the axes whose size is fixed, and the symbolic ones (a name the same size everywhere).
        self._fixed = {info.name: tuple((a, d) for a, d in enumerate(info.shape or ()) if isinstance(d, int))
                       for info in self.inputs}
        self._symbols = {info.name: tuple((a, d) for a, d in enumerate(info.shape or ()) if isinstance(d, str))
                         for info in self.inputs if info.shape and any(isinstance(d, str) for d in info.shape)}

    def _names(self) -> list[str]:
        return [info.name for info in self.inputs]

    def named(self, inputs: Any) -> dict[str, Any]:
        """Name the fed values: a mapping by name, or a sequence (one array alone) in ``graph.input`` order.

        Raises:
          ValueError: an unknown name, more values than graph inputs, a graph input without an initializer
            default left out.
        """
        if self._double and not jax.config.jax_enable_x64:
            self._double = False
            warnings.warn("the model has DOUBLE tensors, which run as float32 while JAX's 64-bit mode is off (and "
                          "INT64 as int32): for ONNX's own types, turn it on with "
                          "jax.config.update('jax_enable_x64', True) or inside `with jax.enable_x64(True):`",
                          UserWarning, stacklevel=3)
        if isinstance(inputs, Mapping):
            unknown = [name for name in inputs if name not in self.by_name]
            if unknown:
                raise ValueError(f"feed {unknown[0]!r} is not a graph input; the graph inputs are {self._names()}")
            feeds = dict(inputs)
        else:
            if isinstance(inputs, (np.ndarray, np.generic, jax.Array)) or not isinstance(inputs, Sequence):
                inputs = [inputs]
            if len(inputs) > len(self.inputs):
                raise ValueError(f"got {len(inputs)} values but the model has {len(self.inputs)} inputs "
                                 f"{self._names()}")
            feeds = {info.name: value for info, value in zip(self.inputs, inputs)}
        missing = [name for name in self._required if name not in feeds]
        if missing:
            raise ValueError(f"graph inputs {missing} are not fed (and have no initializer default); feed the "
                             f"values in graph.input order {self._names()} or one mapping by name")
        return feeds

    def check(self, name: str, value: Any) -> Any:
        """``value`` fed for the graph input ``name``, checked and converted to the dtype it runs as.

        Raises:
          TypeError: not an array, a Python value or array of another kind than the declared type, a float,
            complex or bool array of another dtype.
          ValueError: a concrete integer that does not fit the input's dtype; another rank, or another size on
            a fixed dimension.
        """
        info = self.by_name[name]
        if info.container:
            return self._contained(name, value, info.container)
        return self._tensor(name, value)

    def _contained(self, name: str, value: Any, container: tuple[str, ...]) -> Any:
        """A fed optional (None when empty) or sequence (a list or tuple of arrays, given back as a list), each
        tensor checked as a tensor input is (its shape is not)."""
        if not container:
            return value if self.by_name[name].dtype is None else self._tensor(name, value, shaped=False)
        if container[0] == "optional":
            return None if value is None else self._contained(name, value, container[1:])
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"graph input {name!r} is a sequence of tensors: feed a list of arrays, got "
                            f"{type(value).__name__}")
        return [self._tensor(name, item, shaped=False) for item in value]

    def _tensor(self, name: str, value: Any, *, shaped: bool = True) -> Any:
        info = self.by_name[name]
        declared = np.dtype(info.dtype)
        if declared == STRING:
            return self._shaped(name, self._strings(name, value), shaped)
        wanted = run_dtype(declared)
        python = isinstance(value, (bool, int, float, complex, list, tuple))
        if python:
            try:
                value = np.asarray(value)
            except (ValueError, OverflowError):
                value = np.asarray(value, dtype=object)
            if value.dtype.kind not in "biuf" or (value.dtype.kind == "f" and declared.kind != "f"):
                raise TypeError(f"graph input {name!r} is declared {declared}; cannot feed the Python value "
                                f"{value.tolist()!r}")
        elif not isinstance(value, (np.ndarray, np.generic, jax.Array, jax.core.Tracer)):
            raise TypeError(f"graph input {name!r}: feed a NumPy or JAX array, got {type(value).__name__}")
        dtype = np.dtype(value.dtype)
        if dtype != wanted:
            if declared.kind in "iu" and (dtype.kind in "iu" or python):
                value = self._integer(name, value, declared, wanted, python)
            elif python:
                value = self._narrowed(name, value, declared, wanted, python) if dtype.kind == "f" else \
                    value.astype(wanted)
            elif dtype != declared:
                raise TypeError(f"graph input {name!r} is declared {declared}{_mode_note(declared, wanted)}, fed "
                                f"{dtype}; ONNX does not convert types implicitly: cast the value first")
            elif dtype.kind in "fc":  # a DOUBLE input fed float64 with 64-bit mode off runs as float32, as in JAX
                value = self._narrowed(name, value, declared, wanted, python)
        return self._shaped(name, value, shaped)

    @staticmethod
    def _narrowed(name: str, value: Any, declared: np.dtype, wanted: np.dtype, python: bool) -> Any:
        """A float ``value`` as the narrower ``wanted`` (float64 as float32 with JAX's 64-bit mode off); a concrete
        value with a finite element beyond ``wanted``'s range is refused (it would become infinite), as an integer
        that does not fit is."""
        if isinstance(value, jax.core.Tracer) or not np.size(value):
            return value.astype(wanted)
        concrete = np.asarray(value)
        magnitude = np.abs(concrete[np.isfinite(concrete)])
        high = float(np.finfo(wanted).max)
        if magnitude.size and float(magnitude.max()) > high:
            what = "the Python value" if python else "the value"
            raise ValueError(f"graph input {name!r} is declared {declared}{_mode_note(declared, wanted)}, whose "
                             f"largest finite magnitude is {high:.6g}; {what} {float(magnitude.max()):.6g} does not "
                             f"fit (turn on JAX's 64-bit mode, jax.enable_x64, to run it as {declared})")
        return concrete.astype(wanted)

    def _shaped(self, name: str, value: Any, shaped: bool) -> Any:
        info = self.by_name[name]
        shape = tuple(np.shape(value))
        if shaped and info.shape is not None and shape != info.shape and (
                len(shape) != len(info.shape) or any(shape[a] != d for a, d in self._fixed[name])):
            raise ValueError(f"graph input {name!r} is declared with shape {shape_text(info.shape)}, fed shape "
                             f"{shape}")
        return value

    @staticmethod
    def _strings(name: str, value: Any) -> np.ndarray:
        """A STRING input's value as a NumPy object array of ``str`` (``bytes`` decoded as UTF-8)."""
        array = np.asarray(value, dtype=object) if isinstance(value, (str, bytes, list, tuple)) else value
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "OUS":
            raise TypeError(f"graph input {name!r} is declared string; feed a NumPy array of str, got "
                            f"{type(value).__name__}{'' if not hasattr(value, 'dtype') else ' of ' + str(value.dtype)}")
        flat = []
        for item in array.ravel().tolist():
            if isinstance(item, bytes):
                try:
                    item = item.decode("utf-8")
                except UnicodeDecodeError:
                    raise ValueError(f"graph input {name!r}: a string that is not UTF-8 ({item[:20]!r})") from None
            if not isinstance(item, str):
                raise TypeError(f"graph input {name!r} is declared string; it holds a {type(item).__name__}")
            flat.append(item)
        return string_array(flat, array.shape)

    @staticmethod
    def _integer(name: str, value: Any, declared: np.dtype, wanted: np.dtype, python: bool) -> Any:
        """An integer ``value`` as ``wanted``; a concrete one is range-checked first (``astype`` would wrap)."""
        if not isinstance(value, jax.core.Tracer) and np.size(value):
            concrete = np.asarray(value)
            bounds = np.iinfo(wanted)
            low, high = int(concrete.min()), int(concrete.max())
            if low < bounds.min or high > bounds.max:
                what = "the Python value" if python else "the value"
                raise ValueError(f"graph input {name!r} is declared {declared}{_mode_note(declared, wanted)}, whose "
                                 f"range is [{bounds.min}, {bounds.max}]; {what} "
                                 f"{low if low < bounds.min else high} does not fit")
            return concrete.astype(wanted)
        return value.astype(wanted)

    def checked(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        """Every feed checked (:meth:`check`), and each symbolic dimension the same size wherever it appears."""
        out = {name: self.check(name, value) for name, value in feeds.items()}
        bound: dict[str, tuple[int, str]] = {}
        for name, symbols in self._symbols.items():
            if name not in out:
                continue
            shape = np.shape(out[name])
            for axis, dim in symbols:
                size = shape[axis]
                if dim in bound and bound[dim][0] != size:
                    first, where = bound[dim]
                    raise ValueError(f"dimension {dim!r} is {first} in {where} but {size} in axis "
                                     f"{axis} of graph input {name!r}")
                bound.setdefault(dim, (size, f"axis {axis} of graph input {name!r}"))
        return out

    def split(self, feeds: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
        """``(static values, dynamic names)``: the concrete values of the static inputs, the rest by name."""
        static = {name: np.asarray(value) for name, value in feeds.items()
                  if name in self.static and not isinstance(value, jax.core.Tracer)}  # (strings are among them)
        return static, tuple(name for name in feeds if name not in static)
