"""cupyx of the NumPy-backed CuPy stand-in: only what dtorch uses."""
