"""Errors of the ONNX exporter (PyTorch's ``torch.onnx.errors`` names)."""


class OnnxExporterError(RuntimeError):
    """An error of the ONNX exporter."""


class UnsupportedOperatorError(OnnxExporterError):
    """An op met while tracing has no ONNX translation."""
