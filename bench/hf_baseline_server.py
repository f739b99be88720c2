"""A naive Hugging Face transformers server: the baseline a typical user would write.

One request at a time (a lock), `model.generate` per request with its own KV cache and no
reuse across requests, OpenAI-compatible /v1/chat/completions and /v1/completions with SSE
streaming (TextIteratorStreamer). No constrained decoding: response_format is ignored.

    python -m bench.hf_baseline_server --model <HF folder> --port 18070
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


class Generator:
    def __init__(self, model_path: str, dtype: str = "bfloat16", num_threads: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if num_threads:
            torch.set_num_threads(num_threads)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model.eval()
        self.name = model_path

    def generate(self, input_ids: list[int], body: dict, streamer: Any = None) -> list[int]:
        """New token ids for one request (blocking)."""
        max_new = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        temperature = float(body.get("temperature", 1.0) or 0.0)
        kwargs: dict[str, Any] = {"max_new_tokens": max_new, "streamer": streamer,
                                      "pad_token_id": self.tokenizer.eos_token_id}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature,
                          top_p=float(body.get("top_p", 1.0) or 1.0))
            if body.get("seed") is not None:
                self.torch.manual_seed(int(body["seed"]))
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if body.get("ignore_eos"):
            kwargs["min_new_tokens"] = max_new
        stop = body.get("stop")
        if stop:
            kwargs.update(stop_strings=[stop] if isinstance(stop, str) else stop,
                          tokenizer=self.tokenizer)
        ids = self.torch.tensor([input_ids])
        with self.torch.no_grad():
            out = self.model.generate(ids, attention_mask=self.torch.ones_like(ids), **kwargs)
        return out[0, len(input_ids):].tolist()


def _cut_at_stop(text: str, stop: Any) -> tuple[str, bool]:
    stops = [stop] if isinstance(stop, str) else (stop or [])
    hits = [text.index(s) for s in stops if s and s in text]
    return (text[:min(hits)], True) if hits else (text, False)


def create_app(gen: Generator) -> FastAPI:
    app = FastAPI()
    lock = asyncio.Lock()  # one request at a time, in arrival order

    def prompt_ids(body: dict, chat: bool) -> list[int]:
        tok = gen.tokenizer
        if chat:
            text = tok.apply_chat_template(body["messages"], tokenize=False,
                                           add_generation_prompt=True)
            return tok.encode(text, add_special_tokens=False)
        prompt = body["prompt"]
        return list(prompt) if isinstance(prompt, list) else tok.encode(prompt)

    def usage(prompt_len: int, completion_len: int) -> dict:
        return {"prompt_tokens": prompt_len, "completion_tokens": completion_len,
                "total_tokens": prompt_len + completion_len,
                "prompt_tokens_details": {"cached_tokens": 0}}

    async def handle(request: Request, chat: bool) -> Any:
        body = await request.json()
        ids = prompt_ids(body, chat)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created, model = int(time.time()), body.get("model", gen.name)
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            async with lock:
                new_ids = await asyncio.to_thread(gen.generate, ids, body)
            text = gen.tokenizer.decode(new_ids, skip_special_tokens=True)
            text, stopped = _cut_at_stop(text, body.get("stop"))
            finish = "stop" if stopped or len(new_ids) < int(
                body.get("max_completion_tokens") or body.get("max_tokens") or 16) else "length"
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return JSONResponse({"id": rid, "object": obj, "created": created, "model": model,
                                 "choices": [choice], "usage": usage(len(ids), len(new_ids))})

        async def events() -> AsyncIterator[bytes]:
            from transformers import TextIteratorStreamer

            def chunk(delta: str | None, finish: str | None = None,
                      use: dict | None = None) -> bytes:
                choices = []
                if delta is not None or finish is not None:
                    c: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
                    if chat:
                        c["delta"] = {"content": delta} if delta else {}
                    else:
                        c["text"] = delta or ""
                    choices.append(c)
                payload = {"id": rid, "object": obj + ".chunk" if chat else obj,
                           "created": created, "model": model, "choices": choices,
                           "usage": use}
                return b"data: " + json.dumps(payload).encode() + b"\n\n"

            async with lock:
                streamer = TextIteratorStreamer(gen.tokenizer, skip_prompt=True,
                                                skip_special_tokens=True)
                result: dict[str, Any] = {}

                def work() -> None:
                    result["ids"] = gen.generate(ids, body, streamer)

                thread = threading.Thread(target=work, daemon=True)
                thread.start()
                sent = ""
                loop = asyncio.get_running_loop()
                while True:
                    piece = await loop.run_in_executor(None, next, streamer, None)
                    if piece is None:
                        break
                    text, _ = _cut_at_stop(sent + piece, body.get("stop"))
                    if len(text) > len(sent):
                        yield chunk(text[len(sent):])
                        sent = text
                await asyncio.to_thread(thread.join)
            new_ids = result.get("ids", [])
            yield chunk(None, "length" if len(new_ids) >= int(
                body.get("max_completion_tokens") or body.get("max_tokens") or 16) else "stop")
            if (body.get("stream_options") or {}).get("include_usage"):
                yield chunk(None, None, usage(len(ids), len(new_ids)))
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": gen.name, "object": "model", "created": 0,
                                            "owned_by": "hf-baseline"}]}

    @app.get("/health")
    async def health() -> Any:
        return {}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await handle(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await handle(request, chat=False)

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="HF folder (default: radixflow's default model, SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18070)
    args = p.parse_args(argv)
    model = args.model
    if model is None:
        from radixflow.runtime.model_loader import resolve_model

        model = str(resolve_model(None))
    gen = Generator(model, args.dtype, args.num_threads)
    uvicorn.run(create_app(gen), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
