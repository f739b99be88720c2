"""Routing requests over several workers: the policy (policy.py, prefix_tree.py) that
`radixflow serve --dp-size N` uses in-process, and `radixflow router` (app.py), the same
policy in front of several `radixflow serve` processes."""
