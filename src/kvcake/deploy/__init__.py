"""``kvcake deploy``: Kubernetes manifests, vLLM fleets and Grafana dashboards rendered from a cluster file."""
