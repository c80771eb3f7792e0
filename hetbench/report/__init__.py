"""Reports: the only place that imports rich. Commands hand plain rows here; only rank 0 calls it."""
