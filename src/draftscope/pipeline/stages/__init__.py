"""One subpackage per stage: its `__init__.py` declares `STAGE` (image, inputs, outputs, argv builder, in-container
entries), the code that runs in the container sits beside it. `pipeline/registry.py` lists them in order."""
