"""What a drafted token is worth on this machine and model: a decode pass's time by its rows,
learned from the passes the scheduler runs, against the tokens a drafted row is expected to
add. Where a row costs little beside the pass (a small model's step, a bandwidth-bound product)
every draft pays; where the products are compute-bound per row (AVX2's int8 products, a batch
of a 1B model: each row ~1/8 of a pass of 8) a row that is accepted less than its cost says
lowers the tokens a second, and is not drafted.

Pure bookkeeping: no torch, no scheduler state."""

from __future__ import annotations

# each row count's mean: the newest pass weighs this much (slow passes fade within ~10 passes)
NEWEST_WEIGHT = 0.2
# the most drafted rows whose expected tokens a second are within this share of the best run:
# a drafting request's latency is worth a little throughput (and a noisy line trims less)
TOLERANCE = 0.05


class RowCost:
    """Seconds per decode pass ~= fixed + per_row * rows: a least-squares line through each
    row count's recent mean pass time."""

    def __init__(self) -> None:
        self.means: dict[int, float] = {}

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        old = self.means.get(rows)
        self.means[rows] = seconds if old is None else (
            (1 - NEWEST_WEIGHT) * old + NEWEST_WEIGHT * seconds)

    def line(self) -> tuple[float, float] | None:
        """(fixed, per_row) seconds, or None before two row counts have been seen."""
        if len(self.means) < 2:
            return None
        n = len(self.means)
        xs, ys = list(self.means), list(self.means.values())
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        per_row = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx)
        fixed = max(0.0, my - per_row * mx)
        return fixed, per_row

    def rows_worth_drafting(self, plain_rows: int, gains: list[float]) -> int:
        """How many of the candidate drafted rows to run beside `plain_rows` rows, where
        gains[i] (descending) is the expected tokens the i-th best drafted row adds: the most
        whose expected tokens a second are within TOLERANCE of the best count's. All of them
        while the line is unknown (those passes are what teach it)."""
        line = self.line()
        if line is None or not gains:
            return len(gains)
        fixed, per_row = line
        rates, tokens = [], float(plain_rows)
        for n in range(len(gains) + 1):
            tokens += gains[n - 1] if n else 0.0
            seconds = fixed + per_row * (plain_rows + n)
            if seconds <= 0:
                return len(gains)
            rates.append(tokens / seconds)
        floor = (1 - TOLERANCE) * max(rates)
        return max(n for n, rate in enumerate(rates) if rate >= floor)
