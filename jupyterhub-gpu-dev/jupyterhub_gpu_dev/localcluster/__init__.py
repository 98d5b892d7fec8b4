"""The local Kubernetes GPU cluster the tests and the demo run."""
