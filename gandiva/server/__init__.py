"""The control plane: job specs, the store, the service that joins it to the scheduler's
loop (``service`` and its parts), and the REST API (``app``)."""
