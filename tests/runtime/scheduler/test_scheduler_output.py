"""The scheduler's outputs alone give the detokenizer everything (scheduler/output.py ->
detokenize.Detokenizer): the text each output shows is the text the old detokenizer, which
was announced each request and searched its stop strings itself, showed for the same outputs.

The scheduler is played by hand here: a Req whose stop checker takes each token as the
scheduler's stop check does (scheduler/stops.py), and make_output after each step.
"""

from __future__ import annotations

import functools

import regex
from helpers.tiny_models import make_tiny_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixflow.runtime import messages
from radixflow.runtime.detokenize import TEXT_LENS_KEPT, Detokenizer, IncrementalDetokenizer
from radixflow.runtime.messages import Finish, ReqTextOut, ReqTokenOut, TokenBatchOut
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduler.grammar import HOLD_BACK_TOKENS
from radixflow.runtime.scheduler.output import make_output
from radixflow.runtime.scheduler.req import Req

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PIECES = ["é", "中文", "😀", "👍🏽", " the", " capital", "\n", "<|im_end|>", "STOP", "##"]
texts = st.lists(st.one_of(st.text(max_size=5), st.sampled_from(PIECES)),
                 min_size=1, max_size=10).map("".join)


@functools.lru_cache(maxsize=1)
def tokenizer():
    return make_tiny_tokenizer()


def encode(text: str) -> list[int]:
    return tokenizer().encode(text, add_special_tokens=False)


def new_req(sampling: SamplingParams, prompt: list[int], *, can_jump: bool = False) -> Req:
    req = Req(rid="r", input_ids=prompt, sampling=sampling, can_jump=can_jump)
    if sampling.stop or sampling.stop_regex:  # as scheduler/stops.py builds it
        req.stop_checker = IncrementalDetokenizer(
            tokenizer(), stop=sampling.stop, stop_regex=sampling.stop_regex,
            skip_special_tokens=sampling.skip_special_tokens,
            spaces_between_special_tokens=sampling.spaces_between_special_tokens,
            prompt_ids=prompt)
    return req


def schedule(req: Req, tokens: list[int], steps: list[int], eos: int) -> list[ReqTokenOut]:
    """Append `tokens` a step of `steps[i]` tokens at a time (as decode, overlap and jumps do),
    finishing as the scheduler does; the outputs of every step, through msgpack."""
    outputs, pos, turn = [], 0, 0
    while req.finish is None:
        for _ in range(steps[turn % len(steps)]):
            token = tokens[pos]
            pos += 1
            req.output_ids.append(token)
            if token == eos:  # ends it before the stop check sees it
                req.finish = Finish(type="stop", matched=token)
                break
            if req.stop_checker is not None:
                req.stop_checker.append([token])
                if req.stop_checker.matched_stop is not None:
                    req.finish = Finish(type="stop", matched=req.stop_checker.matched_stop)
                    break
            if pos == len(tokens):
                req.finish = Finish(type="length", length=len(tokens))
                break
        turn += 1
        out = make_output(req)
        if out is not None:
            wire = messages.decode(messages.encode(TokenBatchOut(outputs=[out])))
            outputs.extend(wire.outputs)
    return outputs


def old_detokenizer_texts(sampling: SamplingParams, prompt: list[int],
                          outputs: list[ReqTokenOut]) -> list[str]:
    """What the detokenizer showed when it was told of the request and searched its stops."""
    det = IncrementalDetokenizer(
        tokenizer(), stop=sampling.stop, stop_regex=sampling.stop_regex,
        skip_special_tokens=sampling.skip_special_tokens,
        spaces_between_special_tokens=sampling.spaces_between_special_tokens,
        no_stop_trim=sampling.no_stop_trim, prompt_ids=prompt)
    texts = []
    for out in outputs:
        det.append(out.new_ids)
        if out.finish is not None:
            det.finish()
        texts.append(det.text)
    return texts


def detokenized(outputs: list[ReqTokenOut]) -> list[ReqTextOut]:
    detok = Detokenizer(tokenizer())  # fresh: nobody told it of the request
    texts = []
    for out in outputs:
        got, forward = detok.handle(TokenBatchOut(outputs=[out]))
        assert forward is None
        texts.extend(got)
    assert not detok.states  # the finish ended the request's state
    return texts


def piece_of(full: str, data: st.DataObject) -> str:
    """A stop: a piece of the output, so that it does occur, or any short text."""
    if full and data.draw(st.booleans()):
        lo = data.draw(st.integers(0, len(full) - 1))
        return full[lo:data.draw(st.integers(lo + 1, min(len(full), lo + 4)))]
    return data.draw(st.text(min_size=1, max_size=3))


@SETTINGS
@given(text=texts, data=st.data(), no_stop_trim=st.booleans(), skip_special=st.booleans(),
       can_jump=st.booleans(), end_with_eos=st.booleans(),
       steps=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       interval=st.sampled_from([None, 1, 3]))
def test_the_stream_is_the_old_detokenizers(text, data, no_stop_trim, skip_special, can_jump,
                                            end_with_eos, steps, interval):
    tok = tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    tokens = encode(text) + ([eos] if end_with_eos else [])
    tokens = tokens or [eos]
    full = tok.decode(tokens, skip_special_tokens=skip_special)
    stops = [piece_of(full, data) for _ in range(data.draw(st.integers(0, 2)))]
    patterns = [regex.escape(piece_of(full, data)).replace("e", ".")
                for _ in range(data.draw(st.integers(0, 1)))]
    sampling = SamplingParams(stop=stops, stop_regex=patterns, no_stop_trim=no_stop_trim,
                              skip_special_tokens=skip_special, stream_interval=interval)
    prompt = encode("The capital of")
    outputs = schedule(new_req(sampling, prompt, can_jump=can_jump), tokens, steps, eos)

    assert outputs[0].decode is not None and all(o.decode is None for o in outputs[1:])
    assert all((o.text_len is None) == (not stops and not patterns) for o in outputs)
    got = detokenized(outputs)
    assert [t.text for t in got] == old_detokenizer_texts(sampling, prompt, outputs)
    assert all(t.token == o for t, o in zip(got, outputs, strict=True))


def test_a_first_output_decodes_at_a_fresh_detokenizer():
    prompt, output = encode("Paris is the"), encode(" capital of France 😀")
    sampling = SamplingParams(max_new_tokens=len(output))
    outputs = schedule(new_req(sampling, prompt), output, [3], eos=-1)
    spec = outputs[0].decode
    assert spec is not None and spec.context_ids == prompt[-5:]
    texts = [t.text for t in detokenized(outputs)]
    assert texts[-1] == " capital of France 😀"
    assert all("\ufffd" not in t for t in texts)  # half an emoji waits until it is whole


def test_stop_regex_and_a_split_stop_string_cut_where_the_scheduler_stopped():
    tok = tokenizer()
    tokens = encode("The answer is 42. Done")
    for sampling, want in [(SamplingParams(stop_regex=[r"\d+\."]), "The answer is "),
                           (SamplingParams(stop_regex=[r"\d+\."], no_stop_trim=True),
                            "The answer is 42."),
                           (SamplingParams(stop=["swer is"]), "The an")]:
        outputs = schedule(new_req(sampling, []), tokens, [1], eos=tok.eos_token_id)
        assert outputs[-1].finish.type == "stop"
        texts = [t.text for t in detokenized(outputs)]
        assert texts[-1] == want and all(want.startswith(t) for t in texts)


def test_held_back_tokens_show_only_the_text_of_the_tokens_sent():
    """A jumping request holds its last tokens back (a jump may rewrite them): the text
    shown is the stop checker's after the last token sent, not after the last appended."""
    req = new_req(SamplingParams(stop=["ab"]), [], can_jump=True)
    tokens = [t for char in "xxxxxxac" for t in encode(char)]
    assert len(tokens) == 8 == HOLD_BACK_TOKENS + 4
    for token in tokens:
        req.output_ids.append(token)
        req.stop_checker.append([token])
    out = make_output(req)
    assert out.new_ids == tokens[:4] and req.stop_checker.text == "xxxxxxac"
    assert out.text_len == 4  # "xxxx": a jump may still rewrite the tokens held back
    assert HOLD_BACK_TOKENS < TEXT_LENS_KEPT  # text_len_at knows every token held back
