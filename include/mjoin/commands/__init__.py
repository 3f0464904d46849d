"""CLI commands, one module each (see ``mjoin.cli``)."""
