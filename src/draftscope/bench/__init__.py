"""Benchmarks: the decode loops (`decode`), backends, supervisor, worker and records."""
