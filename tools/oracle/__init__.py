"""Hint oracle: upstream Kubernetes code behind a JSON-lines pipe (see README.md here)."""
