"""Dispatch-contention and scale benchmarks of the admission plane (see BENCHMARKS.md)."""
