"""The job library for scripts whose training loop belongs to a framework.

- ``lightning``: PyTorch Lightning, with no change to the script (the callback is found
  through Lightning's ``lightning.pytorch.callbacks_factory`` entry point when a job runs
  under gandiva) or as ``Trainer(callbacks=[GandivaCallback()])``.
- ``hf``: Hugging Face ``transformers.Trainer``: ``gandiva.job.integrations.hf.train(
  trainer)`` in place of ``trainer.train()``.

Both install with ``pip install 'gandiva[integrations]'``. Each turns the framework's
end-of-mini-batch hook into the job library's safe point (``Job.boundary``) and checkpoints
through the framework's own format and resume mechanism, so a restored job continues
mid-epoch as if never stopped.
"""
