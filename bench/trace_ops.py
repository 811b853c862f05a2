"""Sums Chrome traces of training steps by operator, to say where two sides' steps differ: bridge's (the Profiler
callback: gpt_train_bench ... 'callbacks=[{type: Profiler, start_step: 3, num_steps: 2, output_dir: DIR}]') and
Python's (gpt_train_bench.py / llama_train_bench.py / qwen3_moe_train_bench.py --profile TRACE.json). Per trace, in ms
per step (the steps are the ProfilerStep#<n> ranges): each operator's self time (its time less the operators it
called), and each backward node's time with what it called ("<Node>Backward" rows, the backward of one forward op
type). Traces side by side, one column each, sorted by the largest difference.

  .venv/bin/python bench/trace_ops.py DIR/trace_rank0.json python.json [--top 40]
"""
import argparse
import collections
import json

BACKWARD_PREFIX = "autograd::engine::evaluate_function: "


def summarize(path):
    """(self ms per step by operator, inclusive ms per step by backward node, steps, step ms)."""
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in spans if e["name"].startswith("ProfilerStep#")]
    if not steps:
        raise SystemExit(f"{path}: no ProfilerStep#<n> ranges")
    windows = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in steps]
    by_thread = collections.defaultdict(list)
    for e in spans:
        if e["name"].startswith("ProfilerStep#"):
            continue
        start = float(e["ts"])
        if any(a <= start < z for a, z in windows):
            by_thread[(e.get("pid"), e.get("tid"))].append((start, float(e["dur"]), e["name"]))
    self_us = collections.Counter()
    calls = collections.Counter()
    backward_us = collections.Counter()
    under_us = collections.Counter()  # (outermost range, operator) -> self time
    for rows in by_thread.values():
        rows.sort(key=lambda r: (r[0], -r[1]))
        stack = []  # [end, name, child time]
        def close(until):
            while stack and stack[-1][0] <= until:
                end, name, children, dur = stack.pop()
                self_us[name] += dur - children
                calls[name] += 1
                under_us[(stack[0][1] if stack else name, name)] += dur - children
                if stack:
                    stack[-1][2] += dur
        for start, dur, name in rows:
            close(start)
            if name.startswith(BACKWARD_PREFIX):
                name = name[len(BACKWARD_PREFIX):]
            # The same node may appear twice, nested (the engine's range around the node's own): count the outer.
            if "Backward" in name and not any(s[1] == name for s in stack):
                backward_us[name] += dur
            stack.append([start + dur, name, 0.0, dur])
        close(float("inf"))
    n = len(steps)
    step_ms = sum(float(e["dur"]) for e in steps) / n / 1000
    per_step = {k: v / n / 1000 for k, v in self_us.items()}
    return (per_step, {k: v / n / 1000 for k, v in backward_us.items()}, n, step_ms,
            {k: v / n for k, v in calls.items()}, {f"{k[1]} <- {k[0]}": v / n / 1000 for k, v in under_us.items()})


def table(title, columns, top):
    names = set().union(*columns)
    rows = sorted(names, key=lambda k: -(max(c.get(k, 0) for c in columns) - min(c.get(k, 0) for c in columns)
                                         if len(columns) > 1 else columns[0].get(k, 0)))
    print(title)
    for name in rows[:top]:
        print("  " + " ".join(f"{c.get(name, 0.0):9.1f}" for c in columns) + f"  {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()
    summaries = [summarize(p) for p in args.traces]
    for path, (selfs, _, n, step_ms, _, _) in zip(args.traces, summaries):
        print(f"{path}: {n} steps, {step_ms:.1f} ms a step, operators' self time {sum(selfs.values()):.1f} ms")
    table("self ms per step (columns: the traces in order)", [s[0] for s in summaries], args.top)
    table("backward nodes, ms per step with what they call", [s[1] for s in summaries], args.top)
    table("calls per step", [s[4] for s in summaries], args.top)
    table("self ms per step by operator <- the outermost range it ran in", [s[5] for s in summaries], args.top)


if __name__ == "__main__":
    main()
