"""The bottom layer: errors, dtypes, lazy tensors, byte sources, limits, casts, streamed writes, display."""
