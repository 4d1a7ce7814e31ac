"""Doctor: log signatures, log scanning, diagnosis."""
