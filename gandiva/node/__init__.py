"""The node agent: runs a node's job processes and steers them (start, suspend, resume,
checkpoint, stop), as torchrun's launcher would, speaking ``gandiva.job.wire`` to each rank."""
