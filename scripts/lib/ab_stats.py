"""The A/B statistics every benchmark script of scripts/ prints, written once.

A benchmark runs A and B alternately, pair by pair (or round by round), so that a drift of the
machine's speed hits both sides alike; its figure is the MEDIAN of the per-pair ratios, shown with
the ratios' min and max and, where the issue set one, whether the median meets its target.

Used from the scripts' embedded Python (``sys.path.insert(0, "<repo>/scripts/lib")``) and from the
shell: ``/usr/bin/python3 scripts/lib/ab_stats.py NAME [--target T --sense >=|<=] [--change] R...``
prints the summary line of the ratios R (``--change``: the values are relative changes, printed as
signed percentages).
"""
import argparse
import statistics


def read_records(path):
    """The lines of a record file, each `key=value key=value ...`, as dicts (blank lines skipped)."""
    with open(path) as lines:
        return [dict(field.split("=", 1) for field in line.split()) for line in lines if line.strip()]


def pair_ratios(numerators, denominators):
    """numerator / denominator of each pair, in order (as many as the shorter side has).

    >>> pair_ratios([2, 3, 9], ["4", 3])
    [0.5, 1.0]
    """
    return [float(a) / float(b) for a, b in zip(numerators, denominators)]


def target_met(value, target, sense):
    """Whether `value` meets `target` in `sense` ("<=": at most, ">=": at least).

    >>> target_met(1.03, 1.03, "<="), target_met(1.04, 1.03, "<="), target_met(0.9, 1.0, ">=")
    (True, False, False)
    """
    if sense not in ("<=", ">="):
        raise ValueError(f"sense must be '<=' or '>=', got {sense!r}")
    return value <= target if sense == "<=" else value >= target


def verdict(value, target, sense=">="):
    """The words the scripts print after a figure: its target and met / NOT met, or for information."""
    if target is None:
        return "(for information)"
    return f"target {sense} {target:g}: {'met' if target_met(value, target, sense) else 'NOT met'}"


def summary(name, ratios, target=None, sense=">=", per="per-pair"):
    """Two lines: every ratio, then min / median / max and the median's verdict.

    >>> print(summary("A/B", [1.2, 0.8, 1.1, 1.0], target=1.03, sense="<="))
      A/B: per-pair ratios 1.200 0.800 1.100 1.000
      A/B: min 0.800  median 1.050  max 1.200   target <= 1.03: NOT met
    >>> print(summary("B/A", [2.0, 1.0, 4.0], per="per-round"))
      B/A: per-round ratios 2.000 1.000 4.000
      B/A: min 1.000  median 2.000  max 4.000   (for information)
    """
    if not ratios:
        return f"  {name}: no complete pair"
    median = statistics.median(ratios)
    return (f"  {name}: {per} ratios " + " ".join(f"{r:.3f}" for r in ratios) + "\n"
            f"  {name}: min {min(ratios):.3f}  median {median:.3f}  max {max(ratios):.3f}   "
            + verdict(median, target, sense))


def change_summary(name, changes):
    """One line for relative changes (e.g. -0.012 = 1.2% less): min, median, max as signed percents.

    >>> change_summary("loss", [0.02, -0.01, 0.005])
    'loss: min -1.00%, median +0.50%, max +2.00% over 3 pairs'
    """
    values = sorted(changes)
    return (f"{name}: min {values[0] * 100:+.2f}%, median {statistics.median(values) * 100:+.2f}%, "
            f"max {values[-1] * 100:+.2f}% over {len(values)} pairs")


def main():
    parser = argparse.ArgumentParser(description="Summarize the per-pair ratios of an A/B benchmark.")
    parser.add_argument("name")
    parser.add_argument("values", nargs="+", type=float)
    parser.add_argument("--target", type=float)
    parser.add_argument("--sense", default=">=", choices=("<=", ">="))
    parser.add_argument("--change", action="store_true", help="the values are relative changes")
    args = parser.parse_args()
    print(change_summary(args.name, args.values) if args.change
          else summary(args.name, args.values, args.target, args.sense))


if __name__ == "__main__":
    main()
