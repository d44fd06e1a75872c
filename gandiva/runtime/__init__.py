"""Where the job library lived before the package was laid out by role (``gandiva.job``)."""
