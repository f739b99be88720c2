"""`select`: score every choice by the model's log-probabilities of its tokens after the prompt.

Requests, all on the native /generate API:
  1. {"text": P, max_new_tokens 0}: computes and caches the shared prefix once, gives its length L.
  2. one batch {"text": [P + c ...], max_new_tokens 0, return_logprob, logprob_start_len L-2}:
     every choice hits the cached prefix; the window starts two tokens back because appending
     a choice may re-tokenise the end of P.
  3. unconditional_likelihood_normalized only: the choice tokens alone, to divide out how
     likely each choice is with no context.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Generate = Callable[[dict], Any]

SELECT_METHODS = ("token_length_normalized", "sum", "unconditional_likelihood_normalized",
                  "greedy_token_selection")


def _as_list(resp: Any) -> list[dict]:
    return resp if isinstance(resp, list) else [resp]


def choice_token_entries(entries: list[list], choice: str) -> list[list]:
    """The [logprob, id, text] entries of `choice`'s tokens at the end of a logprob window.

    entries[0] is the window's unscored first token (logprob null). Walking back from the end
    until the token texts cover the choice finds its tokens, including one that straddles the
    prompt/choice boundary when tokenisation merged them.
    """
    scored = [e for e in entries[1:] if e[0] is not None]
    if any(e[2] is None for e in scored):  # no token text: assume the prompt kept its tokens
        return scored[1:] if len(scored) > 1 else scored
    covered, k = 0, len(scored)
    while k > 0 and covered < len(choice):
        k -= 1
        covered += len(scored[k][2])
    return scored[k:]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def select_choice(generate: Generate, prompt: str, choices: list[str],
                  method: str = "token_length_normalized") -> tuple[int, dict[str, Any], int]:
    """(index of the best choice, meta info with the scores, number of requests made)."""
    pre = generate({"text": prompt, "sampling_params": {"max_new_tokens": 0}})
    prompt_len = int(pre["meta_info"]["prompt_tokens"])
    batch = _as_list(generate({
        "text": [prompt + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True, "return_text_in_logprobs": True,
        "logprob_start_len": max(prompt_len - 2, 0),
    }))
    token_entries = [choice_token_entries(r["meta_info"]["input_token_logprobs"], c)
                     for r, c in zip(batch, choices, strict=True)]
    cond = [[float(e[0]) for e in entries] for entries in token_entries]
    num_requests = 2
    meta: dict[str, Any] = {"method": method, "choices": list(choices), "prompt_tokens": prompt_len,
                            "input_token_logprobs": token_entries}
    if method == "sum":
        scores = [sum(lp) if lp else None for lp in cond]
    elif method == "unconditional_likelihood_normalized":
        scored = [i for i, entries in enumerate(token_entries) if entries]
        uncond_resp = iter(_as_list(generate({
            "input_ids": [[e[1] for e in token_entries[i]] for i in scored],
            "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
            "logprob_start_len": 0,
        }))) if scored else iter(())
        num_requests += 1 if scored else 0
        uncond = [[e[0] or 0.0 for e in next(uncond_resp)["meta_info"]["input_token_logprobs"]]
                  if i in scored else [] for i in range(len(choices))]
        meta["unconditional_token_logprobs"] = uncond
        scores = [_mean([c - u for c, u in zip(c_lp, u_lp, strict=False)])
                  for c_lp, u_lp in zip(cond, uncond, strict=True)]
    else:  # token_length_normalized; greedy_token_selection keeps these as its scores
        scores = [_mean(lp) for lp in cond]
    meta["scores"] = scores
    meta["normalized_prompt_logprobs"] = scores  # SGLang's name for the same list
    if method == "greedy_token_selection":
        return greedy_pick(cond), meta, num_requests
    best = max(range(len(choices)),
               key=lambda i: float("-inf") if scores[i] is None else scores[i])
    return best, meta, num_requests


def greedy_pick(cond: list[list[float]]) -> int:
    """SGLang's greedy_token_selection: the choice whose first token is likeliest, ties
    broken by the next token, and so on; a choice shorter than another continues with its own
    mean log-probability."""
    width = max((len(lp) for lp in cond), default=0)
    rows = [lp + [_mean(lp)] * (width - len(lp)) if lp else [float("-inf")] * width
            for lp in cond]
    remaining = list(range(len(cond)))
    for j in range(width):
        top = max(rows[i][j] for i in remaining)
        remaining = [i for i in remaining if rows[i][j] == top]
        if len(remaining) == 1:
            break
    return remaining[0]
