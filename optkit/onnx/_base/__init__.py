"""The ground floor of optkit.onnx: its vocabulary (values and dtypes, errors, limits, trace-time options) and
one walker for nested graphs. Imports nothing of optkit.onnx."""
