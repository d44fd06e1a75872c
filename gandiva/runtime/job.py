"""The job library's old import, ``import gandiva.runtime.job as gj``: the same module as
``gandiva.job`` (one ``init()``, one ``Job``), with a warning naming the new import."""

import sys
import warnings

import gandiva.job

warnings.warn("gandiva.runtime.job is now gandiva.job: `import gandiva.job as gj`",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = gandiva.job
