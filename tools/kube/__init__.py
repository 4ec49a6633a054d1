"""Real Kubernetes components for the lab: build (build.sh) and a control plane in a network namespace."""
