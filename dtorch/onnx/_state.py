"""Whether an export is tracing a forward pass (is_in_onnx_export)."""
active = False
