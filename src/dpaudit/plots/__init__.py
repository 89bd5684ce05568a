"""Figures, rendered only from result tables (see :func:`dpaudit.io.read_table`)."""
