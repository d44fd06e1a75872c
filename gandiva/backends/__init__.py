"""The scheduler's real bodies: the ``Driver`` (the loop on a wall clock) and the ``Nodes``
it drives (this machine's agent, Ray's nodes, hollow nodes). The simulator, the third body,
is ``gandiva.sim``."""
