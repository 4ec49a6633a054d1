"""zonemeter tools: the lab (a multi-zone cluster in network namespaces), the before/after report and other utilities."""
