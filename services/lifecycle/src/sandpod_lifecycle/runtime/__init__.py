"""Runtime drivers: ``process`` (no isolation) and ``local`` (namespace jail)."""
