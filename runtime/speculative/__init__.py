"""Speculative decoding without a draft model: drafts from the request's own tokens (n-gram /
prompt lookup, ngram.py) and from a prediction the client sent (OpenAI's Predicted Outputs),
verified in the next decode pass (scheduler/speculate.py). config.py is a leaf: the server's
flags read it."""
