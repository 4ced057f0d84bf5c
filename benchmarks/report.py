"""Render the JSON document of benchmarks/run.py as Markdown tables (for the README).

    .venv/bin/python benchmarks/report.py results.json
"""

from __future__ import annotations

import json
import sys


def _fmt(value, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:.{digits}f}"
    if isinstance(value, int | float):
        return f"{value:,.0f}"
    return str(value)


def render(doc: dict) -> str:
    meta, results = doc["meta"], doc["results"]
    loops = meta["loops"]
    machine = meta["machine"]
    out = [f"Run of {meta['date']} ({meta['mode']} mode), {machine['cores']} cores "
           f"({machine['cpu_model']}), {machine['memory']} RAM, kernel {machine['kernel']}, "
           f"Python {machine['python']}; generator: {meta['generator']['tool']}, "
           f"{meta['generator']['produce_processes']} producer process(es).", ""]
    out += ["| scenario | " + " | ".join(f"{loop} rec/s | {loop} MB/s | {loop} CPU s/GB"
                                          for loop in loops)
            + " | baseline rec/s | ratio (" + ", ".join(loops) + ") |",
            "|---" * (2 + 3 * len(loops) + 1) + "|"]
    for name, entry in results.items():
        if not name.startswith(("produce", "consume")):
            continue
        cells = [name]
        for loop in loops:
            r = entry.get(loop, {})
            cells += [_fmt(r.get("records_per_s")), _fmt(r.get("mb_per_s"), 1),
                      _fmt(r.get("broker_cpu_s_per_gb"), 2)]
        base = entry.get("baseline", {})
        cells.append(_fmt(base.get("records_per_s")))
        cells.append(", ".join(_fmt(entry.get(loop, {}).get("ratio_to_baseline"), 2)
                               for loop in loops))
        out.append("| " + " | ".join(cells) + " |")
    lat = results.get("latency-p1-acks1")
    if lat:
        out += ["", "| latency (5,000 rec/s, acks=1) | p50 ms | p99 ms | p99.9 ms | max ms "
                    "| broker CPU util |", "|---|---|---|---|---|---|"]
        for who in ("baseline", *loops):
            r = lat.get(who, {})
            out.append(f"| {who} | {_fmt(r.get('p50_ms'), 3)} | {_fmt(r.get('p99_ms'), 3)} | "
                       f"{_fmt(r.get('p999_ms'), 3)} | {_fmt(r.get('max_ms'), 3)} | "
                       f"{_fmt(r.get('broker_cpu_util'), 2)} |")
    start, idle, peak = (results.get(k, {}) for k in ("startup", "memory-idle", "memory-peak"))
    if start or idle:
        out += ["", "| | spawn to first connect (median of 5) | ready line | idle RSS MB "
                    "| peak RSS MB under load |", "|---|---|---|---|---|"]
        for who in ("baseline", *loops):
            s, i, p = start.get(who, {}), idle.get(who, {}), peak.get(who, {})
            label = "baseline (bare asyncio listener)" if who == "baseline" else who
            connect = s.get("connect_s_median")
            ready = s.get("ready_line_s_median")
            out.append(f"| {label} | {_fmt(connect * 1000 if connect else None)} ms | "
                       f"{_fmt(ready * 1000 if ready else None)} ms | "
                       f"{_fmt(i.get('idle_rss_mb'), 1)} | {_fmt(p.get('peak_rss_mb'), 1)} |")
    if doc.get("targets"):
        out += ["", "| target | loop | measured | met |", "|---|---|---|---|"]
        for t in doc["targets"]:
            value = t.get("value")
            if value is None:
                shown = "-"
            elif "start-up" in t["target"]:
                shown = f"{value * 1000:.0f} ms"
            elif "RSS" in t["target"]:
                shown = f"{value:.1f} MB"
            else:
                shown = (f"worst {value:,.0f}/s ({t.get('worst_scenario')}), "
                         f"best {t.get('best_value', 0):,.0f}/s")
            met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
            out.append(f"| {t['target']} | {t['loop']} | {shown} | {met} |")
    if meta.get("warnings"):
        out += ["", "Warnings: " + "; ".join(meta["warnings"])]
    return "\n".join(out) + "\n"


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        sys.stdout.write(render(json.load(f)))


if __name__ == "__main__":
    main()
