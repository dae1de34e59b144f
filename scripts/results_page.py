#!/usr/bin/python3
"""Writes docs/results.md and its plots from the figures scripts/results.sh stored (docs/results/*.json).

    /usr/bin/python3 scripts/results_page.py [--data DIR] [--images DIR] [--out FILE] [--check]

--check: write nothing; exit 1 if FILE differs from what the figures give (the page is never edited
by hand: ctest's results_page runs this). Plots are drawn with gnuplot (SVG); --check skips them.
"""
import argparse
import json
import os
import subprocess
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(data, name):
    path = os.path.join(data, name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def measured(d):
    return f"Measured {d['date']} on {d['machine']}:\n\n```\n{d['command']}\n```"


def spread(values):
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def ddp_section(d):
    rows = [[r["model"], r["method"], f"{r['ddp']:.0f}", f"{r['cli']:.0f}", f"**{r['cli_over_ddp']:.2f}x**",
             f"{r['python']:.0f}", f"**{r['python_over_ddp']:.2f}x**", spread(r["cli_over_ddp_all"])]
            for r in d["rows"]]
    return "\n\n".join([
        "## Against PyTorch DDP",
        f"The same training (Fashion-MNIST, batch {d['batch']} per rank, SGD lr 0.01) in {d['ranks']} processes "
        "under `mpirun`: PyTorch's DistributedDataParallel (gloo) running `bench/python/mlp_train.py`, the same "
        "script through `pipesgd.torch` (one import changed), and the `pipesgd` CLI on the same model. "
        "Samples per second, medians over alternated rounds; each ratio is the median of the per-round ratios. "
        "4 ranks share 2 cores here, so the compute of every side is stretched alike.",
        table(["model", "method", "DDP", "pipesgd CLI", "CLI / DDP", "pipesgd.torch", "pipesgd.torch / DDP",
               "CLI / DDP per round"], rows),
        measured(d)])


def pipe_section(d, images, draw):
    rows = [[r["model"], r["method"], f"{r['samples_per_s']:.0f}", f"{r['iteration_ms']:.2f}", f"{r['compute_ms']:.2f}",
             f"{r['comm_ms']:.2f}", f"{r['exposed_ms']:.2f}", f"**{r['over_dsync']:.2f}x**", spread(r["over_dsync_all"])]
            for r in d["rows"]]
    if draw:
        with tempfile.TemporaryDirectory() as tmp:
            dat = os.path.join(tmp, "pipe.dat")
            with open(dat, "w") as f:
                for r in d["rows"]:
                    f.write(f'"{r["model"]} {r["method"]}" {r["compute_ms"]:.4f} {r["exposed_ms"]:.4f}\n')
            gnuplot(f"""set terminal svg size 720,340 font 'sans,12' background '#ffffff'
set output '{os.path.join(images, "results-pipe.svg")}'
set title 'Where an iteration goes: 2 workers, emulated 10GbE (medians)'
set ylabel 'ms per iteration'
set style data histograms
set style histogram rowstacked
set style fill solid 0.8 border -1
set boxwidth 0.7
set key outside right top
set xtics rotate by -20
plot '{dat}' using 2:xtic(1) title 'compute' lc rgb '#4c78a8', '' using 3 title 'exposed communication' lc rgb '#e45756'
""")
    return "\n\n".join([
        "## Pipe-SGD against D-Sync",
        f"{d['workers']} workers (one per core, threads of one process) over an emulated 10 Gbit/s Ethernet "
        "(each worker its own NIC, 20 us latency). D-Sync computes, then waits for its whole allreduce; "
        "Pipe-SGD reduces iteration t's gradient while t + 1 computes, so only what does not fit behind "
        "the compute is exposed; `+int8` quantizes inside the ring (4x fewer bytes). Times in ms per "
        "iteration (medians); `x dsync` is the median of the per-round throughput ratios, the methods' "
        "order rotated from round to round. The limit of pipelining is max(compute, comm) against "
        "compute + comm: below 2x, less where comm and compute share the 2 cores.",
        table(["model", "method", "samples/s", "iteration", "compute", "comm", "exposed", "x dsync",
               "x dsync per round"], rows),
        "![compute and exposed communication per iteration](images/results-pipe.svg)",
        measured(d)])


def accuracy_section(d):
    settings = list(dict.fromkeys(r["setting"] for r in d["rows"]))
    epochs = d["epochs"]
    out = ["## Accuracy",
           f"Test accuracy (%) after each of {epochs} epochs, mlp on Fashion-MNIST, {d['workers']} workers. "
           "Runs are deterministic for a seed: these figures reproduce exactly. A stale method trades "
           "accuracy for speed; how much depends on the optimizer: with momentum, Pipe-SGD's stale "
           "gradient acts like extra momentum and overshoots, which is why `train` and "
           "`DistributedOptimizer` warn about the combination and SAPipe (stale first layers only, "
           "compensated) is the method to try instead."]
    for setting in settings:
        rows = []
        base = None
        for r in (r for r in d["rows"] if r["setting"] == setting):
            acc = [a for a in r["test_accuracy"] if a is not None]
            final = acc[-1] * 100 if acc else None
            if r["method"] == "dsync":
                base = final
            rows.append([r["method"]] + [f"{a * 100:.2f}" for a in acc] +
                        [f"{final - base:+.2f}" if base is not None and final is not None else "-"])
        out.append(f"**{setting}**\n\n" + table(["method"] + [f"epoch {e + 1}" for e in range(epochs)] +
                                                ["vs dsync (points)"], rows))
    out.append(measured(d))
    return "\n\n".join(out)


def simulate_section(d, images, draw):
    methods = list(dict.fromkeys(r["method"] for r in d["rows"]))
    workers = sorted({r["workers"] for r in d["rows"]})
    by = {(r["workers"], r["method"]): r for r in d["rows"]}
    rows = [[w] + [f"{by[w, m]['samples_per_s']:.0f} ({by[w, m]['speedup']:.2f}x)" for m in methods] for w in workers]
    if draw:
        with tempfile.TemporaryDirectory() as tmp:
            plots = []
            for i, m in enumerate(methods):
                dat = os.path.join(tmp, f"{i}.dat")
                with open(dat, "w") as f:
                    for w in workers:
                        f.write(f"{w} {by[w, m]['scaling_efficiency']:.4f}\n")
                plots.append(f"'{dat}' using 1:2 with linespoints lw 2 title '{m}'")
            gnuplot(f"""set terminal svg size 720,340 font 'sans,12' background '#ffffff'
set output '{os.path.join(images, "results-simulate.svg")}'
set title 'Simulated: ResNet-50, 10GbE, a device 10x a K80'
set xlabel 'nodes'
set ylabel 'scaling efficiency'
set logscale x 2
set yrange [0:1.05]
set key outside right top
plot {", ".join(plots)}
""")
    return "\n\n".join([
        "## At scale, simulated",
        "What this 2-core machine cannot show: `pipesgd simulate` runs each method on SimGrid from 2 to "
        f"{workers[-1]} nodes of a 10 Gbit/s network (ring allreduce, modelled collectives). The ResNet-50 "
        "profile shipped in `profiles/` stands for one K80 GPU; `--compute-scale 0.1` makes the device ten "
        "times faster, where communication matters. Samples per second (speed-up over dsync):",
        table(["nodes"] + methods, rows),
        "![scaling efficiency per method](images/results-simulate.svg)",
        measured(d)])


def horovod_section(d):
    rows = [[r["ranks"], r["passed"], r["failed"], r["skipped"], ", ".join(r["failing"]) or "-"] for r in d["rows"]]
    return "\n\n".join([
        "## Horovod's own test suite",
        "Horovod's PyTorch test file (`test/parallel/test_torch.py`, kept outside this repository) with "
        "`import horovod.torch as hvd` changed to `import pipesgd.torch as hvd`, one pytest per rank under "
        "`mpirun`. A test passes when it passes on every rank; GPU-only tests skip. Why a test fails (e.g. "
        "float16 sums at 3 ranks, which float16 cannot hold as Horovod's test expects): the table of "
        "differences in the [user guide](user-guide.md#python-pipesgdtorch).",
        table(["ranks", "passed", "failed", "skipped (GPU)", "failing"], rows),
        measured(d)])


def measured_on(on):
    """When, where and at which commit kept rows were measured, in words."""
    return f"{on['date']} on {on['machine']}" + (f" at commit {on['commit']}" if on.get("commit") else "")


def kept_text(kept_on, steady_rows):
    """(whose rows, measured_on) of the kept rows: a model's rows at once where all its networks' rows
    were kept from the same measurement, else each network's."""
    for model in dict.fromkeys(m for m, _ in kept_on):
        nets = list(dict.fromkeys(r["net"] for r in steady_rows if r["model"] == model))
        ons = [kept_on.get((model, net)) for net in nets]
        if all(on == ons[0] for on in ons):
            yield f"{model}'s rows were", ons[0]
        else:
            yield from ((f"{model}'s rows at {net} were", on) for net, on in zip(nets, ons) if on)


# The auto section's throughput target: auto's samples per second over the best candidate's.
AUTO_TARGET = 0.95


def auto_substitution_text(s):
    """The substitution experiment (docs/results/auto_substitution.json, measured by hand): rounds of auto
    at both ends of its candidates (A) and of a fixed method in auto's place (B), the target's statistic of each."""
    def statistic(r):
        runs = r["runs"]
        return statistics.mean(x["samples_per_s"] for x in (runs[0], runs[-1])) / max(x["samples_per_s"] for x in runs[1:-1])
    arms = {name: [statistic(r) for r in s["rounds"] if r["runs"][0]["method"] == name] for name in (s["auto"], s["fixed"])}
    median = {name: statistics.median(v) for name, v in arms.items()}
    chosen = [x["chosen"][-1] for r in s["rounds"] for x in (r["runs"][0], r["runs"][-1])
              if x["method"] == s["auto"] and x["chosen"]]
    ends = lambda name: f"{len(arms[name])} rounds: {', '.join(f'{x:.3f}' for x in arms[name])}; median **{median[name]:.3f}**"
    below = sum(1 for x in arms[s["fixed"]] if x < AUTO_TARGET)
    verdict = (f"A fixed {s['fixed']} in auto's place scores below {AUTO_TARGET:g} in {below} of {len(arms[s['fixed']])} rounds and "
               f"{median[s['fixed']]:.3f} in the median: "
               + ("the statistic misses for a fixed method as well: its figure is set by the luckiest of the "
                  "near-equal candidates and by when the ends ran, not by auto's choosing."
                  if median[s["fixed"]] < AUTO_TARGET else
                  f"auto's median is {median[s['auto']] / median[s['fixed']]:.3f}x the fixed method's at the same "
                  "positions."))
    return (f"Policy sync alone, {s['model']} at {s['net']}, with a substitution (measured by hand; "
            "`docs/results/auto_substitution.json`): alternated rounds of one `compare` each, "
            f"{s['auto']} at both ends of its 4 candidates (A: the target's comparison, a full compare of the "
            f"candidates of policy sync in the same run), or {s['fixed']} (auto's choice in "
            f"{chosen.count(s['fixed'])} of its {len(chosen)} runs here) at both ends in auto's place (B), the "
            "same statistic: the mean of the two ends over the round's best candidate. "
            f"A, {s['auto']}: {ends(s['auto'])} ("
            + ("met" if median[s["auto"]] >= AUTO_TARGET else "not met") + f" in this layout). "
            f"B, {s['fixed']}: {ends(s['fixed'])}. {verdict} "
            f"Measured {s['date']} on {s['machine']}, commit {s['commit']}:\n\n```\n{s['command']}\n```")


def auto_section(d, substitution=None):
    # Rows of the stored figures: one per run, in alternated rounds (`round`; figures stored before
    # rounds existed are one round, 0).
    rnd = lambda r: r.get("round", 0)
    steady_rows = [r for r in d["rows"] if r["kind"] == "steady"]
    # Rows kept from an earlier measurement of other models or networks (results.sh --auto-models,
    # --auto-net) say when and where.
    kept_on = {(r["model"], r["net"]): r["measured_on"] for r in steady_rows if r.get("measured_on")}
    slowed = [r for r in d["rows"] if r["kind"] == "slowed"]
    phases = lambda r: ", ".join(f"{p['method']}@{p['start']}" for p in r["phases"] if p["kind"] == "chosen")
    pct = lambda x: "-" if x is None else f"{100 * x:.2f}"
    ratios_text = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    steady, met, round_counts, both_ends = [], True, [], []  # round_counts: one per model and network
    for model, net in dict.fromkeys((r["model"], r["net"]) for r in steady_rows):
        # A method's runs in a round (auto's: one at each end of the round since results.sh ran it twice,
        # one before), its samples per second the mean of them.
        runs = {}
        for r in steady_rows:
            if r["model"] == model and r["net"] == net:
                runs.setdefault((rnd(r), r["method"]), []).append(r)
        rate = lambda k, m: statistics.mean(r["samples_per_s"] for r in runs[k, m])
        rounds = sorted({k for k, _ in runs})
        round_counts.append(len(rounds))
        if any(len(rs) > 1 for (_, m), rs in runs.items() if m.startswith("auto")):
            both_ends.append(f"{model} at {net}")
        for spec in ("auto:any", "auto"):
            if (rounds[0], spec) not in runs:  # --auto-sync-models: auto (policy sync) and its candidates only
                continue
            ratios, bests, chosen, auto_accuracy, accuracies, startups, costs = [], [], [], [], [], [], []
            # The candidate of the highest median over the rounds, against auto in each round: free of
            # the each-round best's selection (the fastest of N noisy runs of near-equal methods).
            candidates = runs[rounds[0], spec][0]["candidates"]
            median_best = max(candidates, key=lambda c: statistics.median(rate(k, c) for k in rounds))
            over_median_best = statistics.median(rate(k, spec) / rate(k, median_best) for k in rounds)
            # What the same statistic gives a fixed candidate (the noise floor): each candidate's median over
            # the rounds of its samples per second against the round's best, the highest of them.
            over_best = lambda k, c: rate(k, c) / max(rate(k, o) for o in candidates)
            floor_of = {c: statistics.median(over_best(k, c) for k in rounds) for c in candidates}
            floor = max(candidates, key=lambda c: floor_of[c])
            # The same without hindsight: in each round, the candidate the other rounds rank highest on
            # that statistic (a method chosen in advance from earlier measurements), against the round's best.
            picks = {k: max(candidates, key=lambda c: statistics.median(over_best(j, c) for j in rounds if j != k))
                     for k in rounds} if len(rounds) > 1 else {}
            held_out = statistics.median(over_best(k, picks[k]) for k in rounds) if picks else None
            for k in rounds:
                best = max(candidates, key=lambda c: rate(k, c))
                ratios.append(rate(k, spec) / rate(k, best))
                bests.append(best)
                for a in runs[k, spec]:
                    chosen.append(phases(a))
                    auto_accuracy.append(a["test_accuracy"])
                    startups.append(a["startup_cost_fraction"])
                    costs.append(a["profiling_cost_fraction"])
                accuracies += [r["test_accuracy"] for c in candidates for r in runs[k, c]
                               if r["test_accuracy"] is not None]
            ratio = statistics.median(ratios)
            within = all(x is not None and min(accuracies) - 1e-9 <= x <= max(accuracies) + 1e-9 for x in auto_accuracy)
            met = met and ratio >= AUTO_TARGET and within and max(startups) < 0.05
            known = [x for x in auto_accuracy if x is not None]
            steady.append([model, net, spec, "; ".join(dict.fromkeys(chosen)), ", ".join(dict.fromkeys(bests)),
                           f"**{ratio:.3f}**", ratios_text(ratios), f"{over_median_best:.3f} ({median_best})",
                           f"{floor_of[floor]:.3f} ({floor})" if len(rounds) > 1 else "-",
                           f"{held_out:.3f} ({', '.join(dict.fromkeys(picks.values()))})" if picks else "-",
                           f"{pct(min(known))}-{pct(max(known))}" if known else "-",
                           f"{pct(min(accuracies))}-{pct(max(accuracies))}", pct(max(startups)), pct(max(costs))])
    n = max(round_counts)
    rounds_text = (f"{n} alternated rounds" if len(set(round_counts)) == 1 else
                   f"{' or '.join(map(str, sorted(set(round_counts))))} alternated rounds (the 'each round' column)")
    parts = [
        "## `--algo auto`: the run chooses its method",
        "`auto` profiles its first iterations with dsync+optimal, predicts every candidate its policy allows and "
        "switches to the best (of those predicted less than 2% slower than the fastest, the one that trades least accuracy; candidates predicted within "
        "10% of the fastest, and against a trade predicted to gain less than 50% the fastest candidate that trades "
        "less, are tried in the order 1 2 3 2 1, each counting at least 10 iterations and 0.05 s, and the fastest "
        "measured under the same rule is kept, unless one that trades as much accuracy is predicted faster and "
        "measured less slower than the trials can tell apart, the larger of 2% and how far one contender's two "
        "halves measured apart: rows measured before commit 2ff6a0a kept the fastest measured); it chooses again "
        "when its measured iteration, or its comm/compute ratio across a decision boundary, drifts. "
        + (rounds_text if n > 1 else "One round") +
        " per model and network, each one `compare` of auto:any, auto (policy sync) and the "
        + "/".join(str(c) for c in sorted({len(r["candidates"]) for r in steady_rows if r["method"] == "auto:any"}))
        + " candidates of auto:any one after another" + (", the order reversed every other round" if n > 1 else "") +
        ", 2 workers, 1 epoch of Fashion-MNIST; samples per second after each run's start-up (auto's: after its "
        "profiling, with its trials), test accuracy after the epoch. The ratio is auto's samples per second over "
        "the best candidate's of the same round" + (", the median of the rounds" if n > 1 else "") +
        f". Target: auto >= {AUTO_TARGET:g}x the best of the candidates its policy allows, its accuracy within theirs, "
        "start-up under 5% of the run." + (
            " Where candidates are within the machine's noise of each other, each round's best is the luckiest "
            "of several near-equal runs, above the speed of any one of them; the column after the rounds is "
            "auto against one candidate, the one of the highest median over the rounds, in each round "
            "(the median of those ratios): the same comparison without that selection. The column after it is "
            "what the target's statistic gives the candidates themselves, each fixed method's samples per second "
            "over its round's best (the median of the rounds), the highest of them, picked knowing every round: "
            f"below {AUTO_TARGET:g}, no fixed choice reaches the target on this machine's noise. The next column is the "
            "same without hindsight: in each round, the candidate the other rounds put highest on that "
            "statistic (a method chosen in advance from earlier measurements) over the round's best, the "
            "median of the rounds."
            if n > 1 else ""),
        table(["model", "network", "auto", "chose (from iteration)", "best candidate (each round's)",
               "auto / best" + (" (median)" if n > 1 else ""), "each round",
               "auto / the best by median (which)", "a fixed candidate / best (the highest; which)",
               "one chosen from the other rounds / best (which)",
               "auto test %", "candidates' test %",
               "start-up % of the run (max)", "all choosing % of the run (max)"], steady),
        "".join(f"{model} was measured with auto (policy sync) and its candidates only: a round of auto:any "
                f"and its candidates is ~30 min per network. " for model in sorted(
                    {r["model"] for r in steady_rows} - {r["model"] for r in steady_rows if r["method"] == "auto:any"}))
        + "The start-up column is the profiling (and trials) before the first choice, less the same iterations "
        "at the chosen method's speed, against the run's time (`summary.json` `auto.startup_cost_fraction`). The "
        "last column adds every profiling and trial after a drift (`auto.profiling_cost_fraction`)."
        + (f" In the rows of {', '.join(both_ends)}, auto:any and auto ran at both ends of each round (the list "
           "reads the same reversed) and their samples per second are the mean of the two runs, against the "
           "machine's drift through a round" + ("; in the other rows they ran once each, at the start or the end "
                                                "of a round." if len(both_ends) < len(round_counts) else ".")
           if both_ends else "")
        + "".join(f" {who} measured {measured_on(on)} (kept when other rows were measured again)."
                  for who, on in kept_text(kept_on, steady_rows)),
        ("Met in every row." if met else "Not met in every row: see the bold ratios, the accuracies and the "
                                         "start-up column against the targets above.")]
    if substitution:
        parts.append(auto_substitution_text(substitution))
    if slowed:
        auto_name = next(r["method"] for r in slowed if r["method"].startswith("auto"))
        methods = list(dict.fromkeys(r["method"] for r in slowed))
        by = {(rnd(r), r["method"]): r for r in slowed}
        slowed_rounds = sorted({rnd(r) for r in slowed})
        # Per method: its samples/s over the run against auto's of the same round.
        over_auto = {m: [by[k, m]["samples_per_s"] / by[k, auto_name]["samples_per_s"] for k in slowed_rounds]
                     for m in methods}
        median_rate = {m: statistics.median(by[k, m]["samples_per_s"] for k in slowed_rounds) for m in methods}
        ordered = sorted(methods, key=lambda m: -median_rate[m])
        fixed = [m for m in methods if m != auto_name]
        best_fixed = max(fixed, key=lambda m: statistics.median(over_auto[m]))
        best_fixed_ratio = statistics.median(over_auto[best_fixed])
        beats = sum(1 for i, k in enumerate(slowed_rounds) if all(over_auto[m][i] < 1 for m in fixed))
        example = slowed[0]
        # Each side of the slow-down (rows of runs that kept their per-iteration times): a method's
        # ms per iteration before and after, and the ceiling of any choosing: an oracle that ran the
        # best fixed method of each side, switching at no cost, against the best fixed method.
        sided = all("before_s" in r for r in slowed)
        side_ms = lambda r, side: 1e3 * (r["before_s"] / r["slowed_at"] if side == "before"
                                         else r["after_s"] / (r["iterations"] - r["slowed_at"]))
        if sided:
            side_median = {(m, side): statistics.median(side_ms(by[k, m], side) for k in slowed_rounds)
                           for m in methods for side in ("before", "after")}
            side_best = {side: [min(fixed, key=lambda m: by[k, m][side + "_s"]) for k in slowed_rounds]
                         for side in ("before", "after")}
            ceilings = [min(by[k, m]["before_s"] + by[k, m]["after_s"] for m in fixed)
                        / (min(by[k, m]["before_s"] for m in fixed) + min(by[k, m]["after_s"] for m in fixed))
                        for k in slowed_rounds]
        parts += [
            f"A link slowed 4x mid-run (`--inject-fault {d['slowed']}`), {example['model']}, {example['net']}"
            + (f", {len(slowed_rounds)} alternated rounds" if len(slowed_rounds) > 1 else "") +
            ": samples per second over the whole run (start-up, slow-down and re-plan included)"
            + (", the median of the rounds; each method against auto in the same round" if len(slowed_rounds) > 1 else "")
            + ".",
            table(["method", "samples/s over the run" + (" (median)" if len(slowed_rounds) > 1 else ""),
                   "/ auto" + (" (median)" if len(slowed_rounds) > 1 else ""), "each round"]
                  + (["ms per iteration before", "ms per iteration after"] if sided else []) + ["phases"],
                  [[m, f"{median_rate[m]:.0f}", f"{statistics.median(over_auto[m]):.3f}", ratios_text(over_auto[m])]
                   + ([f"{side_median[m, 'before']:.3f}", f"{side_median[m, 'after']:.3f}"] if sided else [])
                   + ["; ".join(dict.fromkeys(phases(by[k, m]) for k in slowed_rounds if by[k, m]["phases"])) or "-"]
                   for m in ordered]),
            (f"auto beats every fixed method: the best of them, {best_fixed}, reached {best_fixed_ratio:.3f}x auto's"
             if best_fixed_ratio < 1 else
             f"Not met: {best_fixed} reached {best_fixed_ratio:.3f}x auto's throughput over the run")
            + (f" (median); auto beat every fixed method in {beats} of {len(slowed_rounds)} rounds."
               if len(slowed_rounds) > 1 else ".")
            + (f" These rows were measured {measured_on(example['measured_on'])} (kept when the steady rows were "
               "measured again)." if example.get("measured_on") else "")]
        if sided:
            parts.append(
                "The ceiling of any choosing (the iteration times of each run's `metrics.jsonl`, before and from the "
                f"slowed iteration {example['slowed_at']}): the fastest fixed method before the slow-down was "
                f"{', '.join(side_best['before'])} and after it {', '.join(side_best['after'])} (each round's). "
                "An oracle that ran the fastest of each side from its first iteration, with no profiling, trial or "
                f"switch, would have taken {ratios_text(ceilings)} times less time than the best fixed method over "
                f"the run (median {statistics.median(ceilings):.3f}): beating every fixed method needs a run whose "
                "best method changes at the slow-down by more than auto's start-up and re-plan cost.")
    parts.append(measured(d))
    return "\n\n".join(parts)


def cluster_section(d):
    size = lambda b: f"{b // (1 << 20)} MiB"
    allreduce = [[r["hosts"], size(r["bytes"]), f"{r['ring_ms']:.2f}", f"{r['mpi_ms']:.2f}", f"{r['busbw_gbit']:.2f}",
                  f"**{r['over_mpi']:.2f}x**"] for r in d["allreduce"]]
    within = sum(abs(r["error"]) <= 0.15 for r in d["simulator"])
    simulator = [[r["hosts"], r["model"], r["method"], f"{r['measured_ms']:.2f}", spread(r["measured_all_ms"]),
                  f"{r['simulated_ms']:.2f}", f"**{r['error']:+.0%}**"] for r in d["simulator"]]
    faults = [[r["fault"], f"{r['passed']} of {r['runs']}",
               "-" if r["seconds_min"] is None else f"{r['seconds_min']:.1f}-{r['seconds_max']:.1f}",
               ", ".join(r["failed"]) or "-"] for r in d["faults"]]
    return "\n\n".join([
        "## A real cluster on this machine",
        "Hosts as network namespaces (`scripts/local-cluster.sh`: own network stack, address and host name; "
        f"each link shaped both ways to {d['rate']} by `tc tbf`, no added delay), one rank per host, "
        "`mpirun` starting them through the cluster's agent, MPI over real TCP between hosts. The hosts "
        "share this machine's 2 cores: past 2 hosts every rank's compute and every TCP stream compete for them.",
        "Ring allreduce (the one in training) against OpenMPI's `MPI_Allreduce` on the same hosts and "
        "buffers (`pipesgd bench allreduce --transport mpi`; medians of 20 interleaved runs; busbw = bytes x "
        "2(p-1)/p / time):",
        table(["hosts", "size", "ring ms", "MPI_Allreduce ms", "ring busbw Gbit/s", "ring vs MPI"], allreduce),
        "The simulator against the hosts: `simulate` (ideal network model, the hosts' link rate, 40 us) on "
        "a profile measured in a D-Sync run of as many workers as hosts on this machine (`profile --in-run`), "
        "against `compare --transport mpi` on the hosts (median iteration of the runs; their spread beside it). "
        f"Within 15%: {within} of {len(d['simulator'])}.",
        table(["hosts", "model", "method", "measured ms", "measured runs", "simulated ms", "error"], simulator),
        f"Faults (tests/cluster, 3 hosts, D-Sync, `--comm-timeout {d['comm_timeout_s']}`): a run passes when mpirun "
        "ends the job, every survivor prints one documented error line, one of them naming the lost rank, "
        "nothing is left running in any host, and (first run of each) the newest checkpoint set resumes.",
        table(["fault", "passed", "fault to end (s)", "failed runs"], faults),
        measured(d)])


def restarts_section(d):
    overhead = [[r["model"], r["method"], f"**{r['wall_ratio']:.3f}**", f"{r['wall_min']:.3f}-{r['wall_max']:.3f}",
                 f"{r['cpu_ratio']:.3f}"] for r in d["overhead"]]
    recovery = [[r["transport"], r["method"], f"{r['detection_s']:g}", f"{r['recovery_s']:g}", r["redone"], r["lost_s"],
                 r["rolled_back_to"], r["identical"]] for r in d["recovery"]]
    drain, files = d["draining_pipe"], d["file_commits"]
    return "\n\n".join([
        "## Surviving failures (--restarts)",
        "With `--restarts R` a failed worker costs a rollback to the newest commit, not the run: among threads "
        "the commits are kept in memory (the 2 newest complete sets, no file), under MPI they are checkpoint "
        "sets in `--checkpoint-dir` and `pipesgdrun --restarts R` relaunches the job. A commit is taken every "
        f"{d['commit_every']} iterations. Measured by hand with the commands below (`scripts/results.sh` does "
        "not rerun this section; its figures are in `docs/results/restarts.json`).",
        "What the commits cost: 1000 iterations, 2 workers (threads), with `--restarts 1` against without, "
        "12 alternated pairs; the median of the per-pair wall ratios (their range beside it) and the CPU ratio. "
        "Target: at most 1.02.",
        table(["model", "method", "wall with / without", "range", "CPU with / without"], overhead),
        f"Met for both. A pipe commit no longer drains the pipeline: it takes each in-flight aggregated "
        f"gradient when its allreduce ends on its own (`TrainingMethod::save_state_when_ready`) and is complete "
        f"K-1 iterations after its boundary; waiting for them at the boundary had cost {drain['mlp']:.3f} (mlp) "
        f"and {drain['cnn']:.3f} (cnn). Commits written to files on `/dev/shm` had cost {files['dsync']:.2f} "
        f"(dsync) and {files['pipe']:.2f} (pipe, mlp). The final weights are the same with and without "
        "`--restarts`.",
        "What a failure costs: rank 1 lost at iteration 170 of 300 (mlp, synthetic, 2 workers), medians of 5 "
        "runs. Among threads the fault is injected and the figures are summary.json's `recoveries` (detection: "
        "the failure to the end of the failed attempt; recovery: the failure to the first iteration after the "
        "rollback; seconds lost: the commit to that iteration). Under MPI rank 1 is killed from outside "
        "(`kill -9`): detection is the kill to mpirun's exit, recovery the kill to the first iteration after "
        "the relaunch (measured with the commits in files, as the MPI path writes them).",
        table(["transport", "method", "detection s", "recovery s", "iterations redone", "seconds lost",
               "rolled back to", "weights = uninterrupted"], recovery),
        "Among threads the survivors see the failure within milliseconds and roll back in memory. Under MPI the "
        "relaunch dominates: about 1.4 s until mpirun ends the job, then new processes load LibTorch and join "
        "MPI again. Every run stayed within one commit interval of work redone, and its final weights were "
        "bit-identical to the uninterrupted run's.",
        python_example_section(d["python_example"]),
        measured(d)])


def python_example_section(p):
    rows = [[k["commit"], f"{k['example']:.2f}", f"{k['example'] - p['uninterrupted']:+.2f}",
             f"{k['exact_batches']:.2f}", f"{k['exact_batches'] - p['uninterrupted']:+.2f}",
             f"{k['exact']:.2f}", f"{k['exact'] - p['uninterrupted']:+.2f}"] for k in p["kills"]]
    return "\n\n".join([
        f"Python `hvd.elastic`: {p['setup']}. Uninterrupted: {p['uninterrupted']:.2f}% test accuracy. Three "
        "scripts: the example as Horovod wrote it (after a resume it trains the epoch's first `len - batch` "
        "batches again, not the remaining ones); the same with only the resume changed to skip the batches "
        "already trained (`itertools.islice`); and that with the generator state put back around "
        "`iter(train_loader)`, whose seed draw the committed state already holds (exact). Command: "
        f"`{p['command']}`.",
        table(["killed at commit", "example %", "gap", "remaining batches %", "gap", "exact %", "gap"], rows),
        "Target: within 0.5 points. The example misses at 4 of 5 kill points (it meets it at 240, the one "
        "its ctest `python_elastic` runs); the exact continuation ends bit-identical to the uninterrupted "
        "run at every kill point (the same final weights' digest; also at 6 points of 2- and 3-epoch runs), "
        "so the misses are the example's resume rule and its extra seed draw, not the rollback."])


def page(data, images, draw):
    parts = ["# Results",
             "What pipesgd measures on this machine, each figure with the command that produced it. The "
             "whole page is written by `bash scripts/results.sh` (hours on an idle machine, most of them the "
             "auto section's rounds; `--only SECTION` reruns one section, the others keep their figures in "
             "`docs/results/`). "
             "Earlier measurements and how they led here are in this file's git history.",
             "The machine has 2 cores and no GPU and is shared: timed figures swing, so every speed "
             "figure is a ratio of runs alternated side by side, the median of several rounds."]
    sections = [("ddp", ddp_section), ("pipe", lambda d: pipe_section(d, images, draw)),
                ("accuracy", accuracy_section), ("simulate", lambda d: simulate_section(d, images, draw)),
                ("horovod", horovod_section), ("auto", lambda d: auto_section(d, load(data, "auto_substitution"))), ("cluster", cluster_section), ("restarts", restarts_section)]
    for name, render in sections:
        d = load(data, name)
        parts.append(render(d) if d else f"## {name}\n\nNot measured yet: `bash scripts/results.sh --only {name}`.")
    return "\n\n".join(parts) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--images", default=os.path.join(REPO, "docs", "images"))
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "results.md"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    text = page(args.data, args.images, draw=not args.check)
    if args.check:
        current = open(args.out).read() if os.path.exists(args.out) else ""
        if current != text:
            print(f"{args.out} is not what {args.data} gives: run /usr/bin/python3 scripts/results_page.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(args.out, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
