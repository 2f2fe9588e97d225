"""Turn the JSON written by benchmarks/ops.py into the markdown table of docs/benchmarks.md.

    python benchmarks/to_markdown.py bench.json >> docs/benchmarks.md
"""

from __future__ import annotations

import json
import sys

COLUMNS = ("eager", "compile", "max-autotune", "liger", "kernelsmith")


def main(path: str) -> None:
    with open(path) as f:
        report = json.load(f)
    print(f"Measured {report['date']} on {report['gpu']}; Python {report['python']}, torch {report['torch']}, "
          f"triton {report['triton']}, Liger-Kernel {report.get('liger') or 'absent'}, kernelsmith "
          f"{report['kernelsmith']}. Copy bandwidth {report['copy_gbps']:.0f} GB/s (best of 20 one-GiB "
          "device-to-device copies, read + write).")
    print(f"Command: `{report['command']}`\n")
    print("| op | shape | " + " | ".join(COLUMNS) + " | vs best other | vs compile | search (s) | winner |")
    print("|---|---|" + "---|" * len(COLUMNS) + "---|---|---|---|")
    for row in report["rows"]:
        if "us" not in row:
            print(f"| {row['op']} | {row['shape']} | error |" + " |" * (len(COLUMNS) + 3))
            continue
        cells = []
        for name in COLUMNS:
            t = row["us"].get(name)
            cells.append(f"{t:.1f} µs ({row['pct_of_copy'][name]:.0f}%)" if t else "–")
        best, comp = row.get("speedup_vs_best"), row.get("speedup_vs_compile")
        ratios = f"{best:.2f}x | {comp:.2f}x" if best and comp else "– | –"
        tunes = [row["tune"]] + ([row["tune_backward"]] if "tune_backward" in row else [])
        search = sum(t["search_wall_s"] for t in tunes)
        winner = " + ".join(
            f"`{t['variant']}` " + ", ".join(f"{k}={v}" for k, v in (t.get("config") or {}).items())
            if t["winner"] == "kernel" else "baseline"
            for t in tunes
        )
        print(f"| {row['op']} | {row['shape']} | " + " | ".join(cells) + f" | {ratios} | {search:.0f} | {winner} |")
    profiled = [row for row in report["rows"] if row.get("kernels")]
    if profiled:
        print("\nDevice time per call (sum of the kernels torch.profiler saw, top 8 per implementation; "
              "host wall time per call in brackets):\n")
        print("| op | shape | " + " | ".join(COLUMNS) + " | vs best other |")
        print("|---|---|" + "---|" * len(COLUMNS) + "---|")
        for row in profiled:
            device = {name: sum(k.get("us", 0.0) for k in kernels) for name, kernels in row["kernels"].items()}
            walls = row["host_wall_us"]
            cells = [f"{device[n]:.1f} µs ({walls[n]:.0f})" if n in device else "–" for n in COLUMNS]
            ratio = "–"
            if "kernelsmith" in device:
                others = [v for k, v in device.items() if k != "kernelsmith"]
                ratio = f"{min(others) / device['kernelsmith']:.2f}x" if others else "–"
            print(f"| {row['op']} | {row['shape']} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1])
