"""The scheduler: continuous batching, chunked prefill, radix-cache-aware admission."""
