"""The local launcher: the work runs here, in this process (`launcher`)."""
