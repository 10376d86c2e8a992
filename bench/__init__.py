"""Benchmarks of vlembed against the PyTorch reference (``vlembed bench``)."""
