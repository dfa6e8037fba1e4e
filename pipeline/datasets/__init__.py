"""Verdicts -> dataset rows: selection, rows, publish, catalog, Hub, stats, report."""
