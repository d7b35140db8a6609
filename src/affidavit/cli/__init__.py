"""Command-line interface: a thin adapter over the service functions."""
