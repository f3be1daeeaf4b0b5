"""The op table: the handlers of :mod:`optkit.onnx._standard` and :mod:`optkit.onnx._training`, assembled.

Each handler module keeps its own list (``HANDLERS``); this module builds the
one table the loader looks operators up in, explicitly, so that importing a
handler module changes nothing elsewhere.
"""

from __future__ import annotations

from optkit.onnx import _standard, _training
from optkit.onnx._table import OpTable

__all__ = ["TABLE", "supported_ops"]

TABLE = OpTable(_standard.HANDLERS, _training.HANDLERS)


def supported_ops() -> list[tuple[str, str, int]]:
    """The op table's rows: every operator version optkit runs.

    Returns:
      Sorted ``(domain, op_type, since_version)`` tuples; domain ``""`` is
      ``ai.onnx``, ``"ai.onnx.preview.training"`` holds Adagrad, Adam,
      Momentum and Gradient. A model importing opset ``N`` runs an operator
      with the row of the newest ``since_version <= N``, if ONNX has no newer
      version of it at ``N``.

    Example:
      >>> import optkit.onnx
      >>> ("ai.onnx.preview.training", "Adam", 1) in optkit.onnx.supported_ops()
      True
    """
    return TABLE.rows()
