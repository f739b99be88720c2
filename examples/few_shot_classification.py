"""Few-shot classification with `select`: the examples form a prefix every program shares
(sent once before the batch, then served from the radix cache); each review's label is the
choice the model finds most likely.

    python examples/few_shot_classification.py [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import argparse

import radixflow as rf

LABELS = ["positive", "negative", "neutral"]
EXAMPLES = [
    ("An absolute delight from start to finish, I would watch it again tonight.", "positive"),
    ("The plot made no sense and the acting was wooden. Two hours I will never get back.",
     "negative"),
    ("It was a film. Some scenes worked, others did not; I have no strong feelings.", "neutral"),
    ("Stunning photography and a moving score. Highly recommended.", "positive"),
    ("Boring, predictable and far too long.", "negative"),
    ("The cinema was half full and the movie lasted about two hours.", "neutral"),
]
REVIEWS = [
    ("What a wonderful, heartwarming story. I loved every minute.", "positive"),
    ("Terrible. The worst film I have seen this year.", "negative"),
    ("Brilliant acting and a clever script, a real treat.", "positive"),
    ("I fell asleep halfway through; dull and lifeless.", "negative"),
]


@rf.function
def classify(s, review: str):
    s += "Classify the sentiment of each movie review as positive, negative or neutral.\n\n"
    for text, label in EXAMPLES:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: " + rf.select("label", choices=LABELS)


def main(backend=None, *, reviews=REVIEWS) -> list[rf.ProgramState]:
    states = classify.run_batch([{"review": r} for r, _ in reviews], backend=backend)
    correct = 0
    for (review, gold), state in zip(reviews, states):
        scores = ", ".join(f"{k} {v:.2f}" for k, v in state.scores("label").items())
        correct += state["label"] == gold
        print(f"{state['label']:>8} (gold {gold}; {scores})  {review}")
    print(f"accuracy: {correct}/{len(reviews)}")
    return states


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a radixflow server (default: the model in-process)")
    cli = parser.parse_args()
    backend = rf.Endpoint(cli.url) if cli.url else rf.Engine()
    try:
        main(backend)
    finally:
        backend.shutdown()
