"""Turn the JSON written by benchmarks/core.py into the markdown table of docs/benchmarks.md.

    python benchmarks/to_markdown.py bench.json >> docs/benchmarks.md
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    with open(path) as f:
        report = json.load(f)
    print(f"Measured {report['date']} on {report['gpu']}; Python {report['python']}, torch {report['torch']}, "
          f"triton {report['triton']}, kernelsmith {report['kernelsmith']}. Copy bandwidth "
          f"{report['copy_gbps']:.0f} GB/s (best of 20 one-GiB device-to-device copies, read + write).")
    print(f"Command: `{report['command']}`\n")
    names = ["eager", "compile", "max-autotune", "kernelsmith"]
    print("| op | shape | " + " | ".join(names) + " | vs best of torch | vs compile | search (s) | winner |")
    print("|---|---|" + "---|" * len(names) + "---|---|---|---|")
    for row in report["rows"]:
        if "us" not in row:
            print(f"| {row['op']} | {row['shape']} | error | | | | | | | |")
            continue
        cells = []
        for name in names:
            t = row["us"].get(name)
            cells.append(f"{t:.1f} µs ({row['pct_of_copy'][name]:.1f}%)" if t else "–")
        best = row.get("speedup_vs_best_torch")
        comp = row.get("speedup_vs_compile")
        config = ", ".join(f"{k}={v}" for k, v in (row.get("config") or {}).items())
        winner = f"{row['winner']} `{row.get('variant', '')}` {config}".strip()
        ratios = f"{best:.2f}x | {comp:.2f}x" if best and comp else "– | –"
        print(f"| {row['op']} | {row['shape']} | " + " | ".join(cells)
              + f" | {ratios} | {row['search_wall_s']:.1f} | {winner} |")


if __name__ == "__main__":
    main(sys.argv[1])
