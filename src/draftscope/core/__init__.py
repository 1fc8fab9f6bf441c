"""The ground floor: errors, JSON I/O and hashing, schemas, configs and presets, provenance, platforms, hub helpers, run directories. Imports nothing above it."""
