"""Benchmarks: `python -m bench.<study>` from the checkout's root."""

import radixflow  # noqa: F401  (first: it puts the checkout's root behind PyPI's `kernels`)
