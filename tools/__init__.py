"""zonemeter tools: the lab (a multi-zone cluster in network namespaces) and the demo built on it."""
