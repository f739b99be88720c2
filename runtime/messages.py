"""Everything that crosses a ZMQ socket: tagged msgspec structs, encoded as msgpack.

Nothing received is ever unpickled; `decode` only builds the classes in `Message`.
One straight line, each process sending to the next only:

    HTTP/SchedulerClient --GenerateReq/AbortReq/FlushCacheReq/Open-/CloseSessionReq--> Scheduler
    Scheduler --TokenBatchOut/SchedulerStats--> Detokenizer --TextBatchOut/...--> SchedulerClient
    (FlushCacheDone, OpenSessionDone, SessionsClosed: the detokenizer passes them on unchanged)

The detokenizer hears of a request from its first ReqTokenOut alone (its DecodeSpec), and of
where its stop strings cut the text from each output's `text_len`; an abort reaches only the
scheduler, which finishes the request with an abort output (nothing follows a finish).
"""

from __future__ import annotations

import msgspec

from .constrained.constraint import Constraint
from .sampling_params import SamplingParams


class _Msg(msgspec.Struct, tag=True, tag_field="msg", frozen=True, omit_defaults=True):
    pass


class SessionParams(msgspec.Struct, frozen=True, omit_defaults=True):
    """A /generate body's `session_params` (SGLang's): which session the request belongs to
    and what of the session's token history comes before its own tokens (see
    scheduler/sessions.py)."""

    id: str
    rid: str | None = None  # the request of the session to continue; None: start a new branch
    offset: int | None = None  # keep history[:offset] (Python slice), when not None or 0
    replace: bool = False  # abort `rid` (or clear the whole session) and take its place
    drop_previous_output: bool = False  # continue from `rid`'s prompt, without its output


class EmbedSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """How an embedding request pools its prompt's final hidden states."""

    pooling: str = "last"  # "last" | "mean" | "cls"
    normalize: bool = True  # L2-normalise the pooled vector
    dimensions: int | None = None  # Matryoshka truncation (before normalising)


class GenerateReq(_Msg):
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: no prompt logprobs
    top_logprobs_num: int = 0
    stream: bool = False
    # The scheduler puts the session's history before input_ids; None: no session.
    session: SessionParams | None = None
    # Separate the thinking of a reasoning model from the answer (--reasoning-parser): its
    # constraint applies after the end-of-thinking marker (scheduler/reasoning.py).
    reasoning: bool = False
    # sampling's constraint as the front door prepared it (constrained.prepare), compiled as
    # it is; None: sampling has none, or the request was built by hand (the scheduler then
    # prepares it on a compile thread).
    constraint: Constraint | None = None
    # --enable-priority-scheduling: lower values are admitted first and retracted last
    # (None: the default, 0).
    priority: int | None = None
    # A tenant's namespace in the radix cache: its prefixes never match another salt's.
    cache_salt: str | None = None
    # Under --dp-size: the replica the client asked for (SGLang's routed_dp_rank).
    routed_dp_rank: int | None = None
    # --is-embedding: compute the prompt, pool its hidden states, finish (no tokens).
    embed: EmbedSpec | None = None
    # Speculative decoding (scheduler/speculate.py): True/False turn it on/off for this
    # request (None: --speculative-algorithm decides); `prediction_ids` are the tokens the client
    # expects (OpenAI's prediction), drafted first (they imply speculation unless it is False).
    speculative: bool | None = None
    prediction_ids: list[int] | None = None


class AbortReq(_Msg):
    rid: str


class FlushCacheReq(_Msg):
    pass


class OpenSessionReq(_Msg):
    session_id: str  # chosen by the sender (a fresh uuid when the client gave none)
    capacity_of_str_len: int  # the most tokens one request of the session may hold
    timeout: float | None = None  # close after this many seconds without a new request


class CloseSessionReq(_Msg):
    session_id: str


class OpenSessionDone(_Msg):
    session_id: str
    success: bool
    message: str | None = None  # why not, when success is False
    # when success is False: 400 (the id is taken) or 429 (--max-open-sessions are open:
    # the HTTP route answers 429 with Retry-After)
    status_code: int | None = None


class SessionsClosed(_Msg):
    """Sessions a scheduler closed on its own (their timeout passed), so the HTTP process
    forgets them too (SchedulerClient.sessions). Passed on by the detokenizer."""

    session_ids: list[str]
    dp_rank: int = 0  # the replica that held them (serve --dp-size)


class Finish(_Msg):
    """Why a request ended; `to_json` is the SGLang `finish_reason` object."""

    type: str  # "stop" | "length" | "abort"
    matched: str | int | None = None  # the stop string or token id
    length: int | None = None
    message: str | None = None
    # An abort the client caused (400: bad grammar, prompt too long) or that failed inside
    # (500); None for client-initiated aborts. Shown as SGLang shows it.
    status_code: int | None = None
    # Budget-safe structured output ended the output with a completion of its grammar, to fit
    # max_new_tokens (scheduler/grammar.py); not part of finish_reason, see meta_info.
    closed_early: bool = False

    def to_json(self) -> dict:
        out: dict = {"type": self.type}
        if self.type == "stop":
            out["matched"] = self.matched
        elif self.type == "length":
            out["length"] = self.length
        elif self.type == "abort":
            out["message"] = self.message
            if self.status_code is not None:
                out["status_code"] = self.status_code
        return out


class DecodeSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    """How a request's tokens become text: the scheduler's stop check decodes them this way,
    and so does the detokenizer, so the stop cuts the scheduler sends fit its text."""

    context_ids: list[int]  # the prompt's last tokens: decoding context, never text
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True


class SpecCounts(_Msg):
    """One request's speculation: verify passes it drafted for, tokens drafted, drafted
    tokens accepted; of those, the ones from the client's prediction."""

    verify_passes: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    prediction_draft_tokens: int = 0
    prediction_accepted_tokens: int = 0


class ReqTokenOut(_Msg):
    """New tokens of one request from one scheduler step (a delta)."""

    rid: str
    new_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish: Finish | None = None
    # Only when return_logprob: one entry per new token (delta).
    output_logprobs: list[float] | None = None
    output_top_logprobs: list[list[tuple[float, int]]] | None = None
    # Only in the first output of a request that asked for prompt logprobs.
    input_logprobs: list[float | None] | None = None
    input_ids: list[int] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    # Only in the first output of a request: how the detokenizer decodes it.
    decode: DecodeSpec | None = None
    # A request with stop strings or regexes: how many characters of its cumulative text
    # may be shown (what could still become a stop is held back; the cut at the stop, or
    # after it with no_stop_trim). None: all of it.
    text_len: int | None = None
    # An embedding request's pooled vector (its only output, with the finish).
    embedding: list[float] | None = None
    # A request that speculated: its counts so far (cumulative, not a delta).
    spec: SpecCounts | None = None


class TokenBatchOut(_Msg):
    outputs: list[ReqTokenOut]


class ReqTextOut(_Msg):
    """ReqTokenOut plus text: `text` is the cumulative, stop-trimmed output so far."""

    token: ReqTokenOut
    text: str


class TextBatchOut(_Msg):
    outputs: list[ReqTextOut]


class SchedulerStats(_Msg):
    num_running: int
    num_waiting: int
    kv_used_tokens: int
    kv_total_tokens: int
    cache_hit_tokens: int  # cumulative prompt tokens served from the radix cache
    prompt_tokens: int  # cumulative prompt tokens seen
    generation_tokens: int  # cumulative generated tokens
    # speculative decoding, cumulative: verify passes (a request's each), drafted tokens, and
    # drafted tokens accepted
    spec_verify_passes: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    dp_rank: int = 0  # the replica that sent it (serve --dp-size)


class FlushCacheDone(_Msg):
    success: bool


class CacheSnapshotReq(_Msg):
    """Ask a scheduler for a view of its radix tree and pools (the /dashboard)."""

    query_id: str
    max_nodes: int = 512


class CacheSnapshot(_Msg):
    """A scheduler's answer to CacheSnapshotReq: `view` is plain JSON (scheduler/cache_view.py
    says what it holds). Passed on by the detokenizer."""

    query_id: str
    view: dict
    dp_rank: int = 0


class ProcessFailed(_Msg):
    """A process reports that it cannot go on (its loop raised)."""

    process: str
    message: str


Message = (GenerateReq | AbortReq | FlushCacheReq | OpenSessionReq | CloseSessionReq | Finish
           | TokenBatchOut | TextBatchOut | SchedulerStats | FlushCacheDone | OpenSessionDone
           | SessionsClosed | CacheSnapshotReq | CacheSnapshot | ProcessFailed)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes) -> Message:
    return _decoder.decode(data)
