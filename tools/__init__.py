"""zonemeter tools: the lab, the before/after report and other utilities beside the agent."""
