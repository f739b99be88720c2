"""How good can drafting from the prompt and output get? Replays drafters over real outputs.

Runs bench.speculative's workloads once without speculation (greedy, in-process Engine, the
default model: with speculation the outputs are the same token for token), then replays, for
each output, what a drafter would have drafted at each verify and how much of it the output
accepts, with a verify pass costing `--pass-ms + --row-ms` per drafted row (the C step's figures
from `python -m bench.speculative --verify-cost-only`). Reported per drafter: TPOT speedup
against decoding one token a pass, accepted / drafted.

Drafters:
- shipped: runtime/speculative/ngram.py with SpecState's draft length, as the server runs it;
- min_n=3: the same, n-grams of 3 tokens or more only;
- by match: draft length = the matched n-gram's length (a short match drafts little);
- best occurrence: of every earlier occurrence of the longest matching n-gram, the one whose
  continuation the output follows longest, cut to exactly what is accepted (no drafter that
  only looks at the tokens can choose better among the matches: the bound for prompt lookup);
- copy oracle: the longest run of the next output tokens found anywhere earlier (no n-gram
  context needed; not realisable, it says how much of the output is a copy at all).

Not modelled: grammar cuts of drafts and jump-forward (forced tokens are counted as decoded
tokens here); the shipped replay's acceptance is checked against the server's own counts by
running bench.speculative on the same workloads.

    python -m bench.spec_drafters [--requests 6] [--row-ms 1.9 0.9]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable

from radixflow.runtime.scheduler.speculate import SpecState
from radixflow.runtime.speculative.ngram import NgramDrafter

from . import speculative as workloads

Drafter = Callable[[list[int], list[int], int], list[int]]  # (sequence, future, k) -> draft


def outputs(names: list[str], requests: int, seed: int) -> dict[str, list[tuple]]:
    import radixflow
    got = {}
    with radixflow.Engine() as engine:
        tok = engine.get_tokenizer()
        for name in names:
            got[name] = []
            for req in workloads.WORKLOADS[name](requests, random.Random(seed)):
                text = tok.apply_chat_template(req["messages"], tokenize=False,
                                               add_generation_prompt=True)
                params = {"max_new_tokens": req["max_tokens"], "temperature": 0,
                          "ignore_eos": bool(req.get("ignore_eos"))}
                if "response_format" in req:
                    params["json_schema"] = json.dumps(
                        req["response_format"]["json_schema"]["schema"])
                out = engine.generate(text, params)
                got[name].append((tok.encode(text, add_special_tokens=False),
                                  out["output_ids"]))
    return got


def occurrences(seq: list[int], low: int, high: int) -> tuple[list[int], int]:
    """Where the continuations of the longest n-gram (low <= n <= high) ending seq start, and
    its n (0: no match)."""
    for n in range(min(high, len(seq) - 1), low - 1, -1):
        suffix = seq[-n:]
        found = [i + n for i in range(len(seq) - n) if seq[i:i + n] == suffix]
        if found:
            return found, n
    return [], 0


def accepted(draft: list[int], future: list[int]) -> int:
    n = 0
    while n < len(draft) and n < len(future) and draft[n] == future[n]:
        n += 1
    return n


def replay(items: list[tuple], make: Callable[[], Drafter], k: int, pass_ms: float,
           row_ms: float, adaptive: bool = True) -> tuple[float, int, int]:
    plain = spec = 0.0
    drafted = kept = 0
    for prompt, out in items:
        drafter, state = make(), SpecState(None, k, k)
        i = 0
        while i < len(out):
            room = min(state.draft_len() if adaptive else k, len(out) - i - 1)
            seq = prompt + out[:i]
            draft = drafter(seq, out[i:], room) if room > 0 else []
            a = accepted(draft, out[i:])
            if draft:
                state.after_verify(len(draft), a)
            drafted, kept = drafted + len(draft), kept + a
            spec += pass_ms + row_ms * len(draft)
            i += a + 1
        plain += pass_ms * len(out)
    return plain / spec, kept, drafted


def shipped(low: int, high: int) -> Callable[[], Drafter]:
    def make() -> Drafter:
        d = NgramDrafter(low, high)
        return lambda seq, future, k: d.draft(seq, k)[0]
    return make


def by_match(low: int, high: int) -> Callable[[], Drafter]:
    def draft(seq, future, k):
        found, n = occurrences(seq, low, high)
        return seq[found[-1]:found[-1] + min(k, n)] if found else []
    return lambda: draft


def best_occurrence(low: int, high: int) -> Callable[[], Drafter]:
    def draft(seq, future, k):
        best = []
        for at in occurrences(seq, low, high)[0]:
            cont = seq[at:at + k]
            n = accepted(cont, future)
            if n > len(best):
                best = cont[:n]
        return best  # (nothing where no occurrence is right: a bound, not a drafter)
    return lambda: draft


def copy_oracle() -> Drafter:
    def draft(seq, future, k):
        n = 0
        while n < min(k, len(future)):
            want = future[:n + 1]
            if not any(seq[i:i + n + 1] == want for i in range(len(seq) - n)):
                break
            n += 1
        return future[:n]
    return draft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="+", default=["copy_extract", "summarise_quote",
                                                       "random_short"])
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--draft-tokens", type=int, default=4)
    ap.add_argument("--pass-ms", type=float, default=7.5)
    ap.add_argument("--row-ms", type=float, nargs="+", default=[1.9, 0.9])
    args = ap.parse_args()
    data = outputs(args.workloads, args.requests, args.seed)
    k = args.draft_tokens
    drafters = [("shipped (n 2-5)", shipped(2, 5), True), ("min_n=3", shipped(3, 5), True),
                ("by match length", by_match(2, 5), True),
                ("best occurrence", best_occurrence(2, 5), False),
                ("copy oracle", copy_oracle, False)]
    print(f"k = {k}, a pass {args.pass_ms} ms + per drafted row {' / '.join(map(str, args.row_ms))}"
          " ms; speedup (accepted / drafted)\n")
    print("| drafter | " + " | ".join(f"{w} @ {r} ms/row" for w in args.workloads
                                      for r in args.row_ms) + " |")
    print("|---|" + "---|" * (len(args.workloads) * len(args.row_ms)))
    for label, make, adaptive in drafters:
        cells = []
        for name in args.workloads:
            for row_ms in args.row_ms:
                speedup, kept, drafted = replay(data[name], make, k, args.pass_ms, row_ms,
                                                adaptive)
                cells.append(f"{speedup:.2f}x ({kept}/{drafted})")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\noutput tokens:", {n: sum(len(o) for _, o in v) for n, v in data.items()})


if __name__ == "__main__":
    main()
