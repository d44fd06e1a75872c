"""The control plane: job specs, the store, the API server (issue 5, in progress)."""
