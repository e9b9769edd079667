"""The retrace services: one package each, run as `python -m services.<name>`."""
