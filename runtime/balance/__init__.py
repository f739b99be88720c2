"""Sharing requests over workers: the cache-aware policy and its prefix tree.

- config.py: PolicyConfig, the policy's knobs and their checks;
- policy.py: LoadBalancer (round robin, shortest queue, cache aware) and NoWorker;
- prefix_tree.py: the approximate multi-tenant prefix tree, and token_key.

Both `radixflow serve --dp-size N` (server/data_parallel.py: workers are replica ranks) and
`radixflow router` (router/: workers are URLs) use it; it imports only the standard library,
and this file imports nothing, so ServerArgs can read config.py.
"""
