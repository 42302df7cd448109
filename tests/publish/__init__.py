"""Publishing ResourceSlices: the Kubernetes client adapter and the slice controller."""
