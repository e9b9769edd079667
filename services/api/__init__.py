"""The control API: tenants drive retrace over HTTP with their API keys."""
