"""The `retrace` command line."""
