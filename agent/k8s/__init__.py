"""Kubernetes metadata: list+watch (or a snapshot file), slim cached records, IP resolution."""
