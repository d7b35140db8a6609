"""HTTP API and web page: a thin adapter over the service functions."""
