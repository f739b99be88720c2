"""The prompts the default-model tests compare against a reference (HF, or --tp-size 1)."""

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "<|im_start|>user\nName a fruit that is yellow.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4, 5,",
    "A haiku about the sea:",
]
