"""The simulator backend: a discrete-event engine over a performance model."""
