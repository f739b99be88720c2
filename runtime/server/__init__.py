"""The HTTP server: tokenizer manager, detokenizer process, FastAPI app, launcher, Runtime."""
