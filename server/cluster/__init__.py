"""Cluster-level endpoints: workers, liveness, readiness and Prometheus metrics."""
