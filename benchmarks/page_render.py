"""Drawing a long streamed answer in the chat page: time per frame in Chromium, before and after.

The page draws the model's text as Markdown on every animation frame while it streams. This
benchmark builds a long Markdown answer (`--chars`, default 20,000 characters: headings,
paragraphs, lists, code blocks and tables) and feeds it in `--deltas` equal pieces (default
2,000) to the page's own modules in a headless Chromium (Debian's `/usr/bin/chromium`,
through Playwright), one draw per piece, as if each delta landed in its own frame:

a. before: every frame draws the whole text again (`renderMarkdown` of the text so far,
   replacing the container's nodes), as the page did;
b. after: `drawMarkdown` (markdown_stream.js), which keeps the blocks that ended and draws
   again only those still open.

Each frame is timed with `performance.now()`: the script alone, and the script plus the
layout it causes (a forced `getBoundingClientRect` after it, as the frame's own layout
would). The table shows the median and p90 per frame over the first and the last 10% of
frames, and the total over all frames (median of `--reps` runs, modes interleaved). The
container sits in the page's own stylesheet (`.block.text.answer .text`), 720 px wide. The
run checks that both modes end with equal DOM trees, and says so.

The page's files are served from the package by a plain static file server on 127.0.0.1;
the chat app itself is not loaded (no routes, no runtime).

Run:  .venv/bin/python benchmarks/page_render.py [--chars 20000] [--deltas 2000] [--reps 3]
      [--json PATH]
Prints a table and writes JSON (default benchmarks/results/page_render.json).
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import platform
import statistics
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import turnkit

PAGE = Path(turnkit.__file__).parent / "http" / "page"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
HOST = "127.0.0.1"

BENCH_HTML = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><link rel="stylesheet" href="page/style.css">
</head><body><div class="block text answer" style="width: 720px">
<div class="text" id="answer"></div></div></body></html>"""

# Runs in the page: both modes over the same pieces, interleaved, `reps` times each.
MEASURE = """async ({ text, deltas, reps }) => {
  const { renderMarkdown } = await import("/page/markdown.js");
  const { drawMarkdown } = await import("/page/markdown_stream.js");
  const box = document.querySelector("#answer");
  const step = text.length / deltas;
  const modes = {
    before: (node, shown) => node.replaceChildren(renderMarkdown(shown)),
    after: (node, shown) => drawMarkdown(node, shown),
  };
  const runs = { before: [], after: [] };
  const finals = {};
  for (let rep = 0; rep < reps; rep += 1) {
    for (const [mode, draw] of Object.entries(modes)) {
      const node = box.cloneNode(false); // a fresh container: no state from the last run
      box.replaceWith(node);
      const script = [];
      const layout = [];
      for (let k = 1; k <= deltas; k += 1) {
        const shown = text.slice(0, Math.round(k * step));
        const t0 = performance.now();
        draw(node, shown);
        const t1 = performance.now();
        node.getBoundingClientRect(); // the layout the frame would do
        const t2 = performance.now();
        script.push(t1 - t0);
        layout.push(t2 - t0);
      }
      runs[mode].push({ script, layout });
      finals[mode] = node;
      node.replaceWith(box);
    }
  }
  const fresh = box.cloneNode(false);
  fresh.append(renderMarkdown(text));
  return {
    runs,
    equal: finals.before.isEqualNode(finals.after) && fresh.isEqualNode(finals.after),
    nodes: finals.after.getElementsByTagName("*").length,
  };
}"""


def answer(chars: int) -> str:
    """A Markdown answer of exactly `chars` characters, the mix a long chat answer has."""
    parts: list[str] = []
    section = 0
    while sum(len(p) + 2 for p in parts) < chars:
        section += 1
        parts += [
            f"## Part {section}",
            " ".join(
                f"Sentence {n} of part {section} says *something* about `item_{n}` and "
                f"links to [the docs](https://example.com/{section}/{n})."
                for n in range(4)
            ),
            "\n".join(f"- point {n}: **{n * section}** units" for n in range(5)),
            "```python\n"
            + "\n".join(f"def step_{n}(x):\n    return x * {n} + {section}" for n in range(4))
            + "\n```",
            "| name | value | note |\n|:-----|------:|------|\n"
            + "\n".join(f"| row {n} | {n * 7} | fine |" for n in range(5)),
            "A closing paragraph for this part, with _emphasis_ and a ~~mistake~~ fixed.",
        ]
    return "\n\n".join(parts)[:chars]


class _Files(http.server.SimpleHTTPRequestHandler):
    def end_headers(self) -> None:
        # Cross-origin isolated: `performance.now()` then counts in 5 µs steps, not 100 µs.
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def do_GET(self) -> None:
        if self.path.split("?")[0] in ("/", "/bench.html"):
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(BENCH_HTML)))
            self.end_headers()
            self.wfile.write(BENCH_HTML)
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve_page_files() -> Iterator[str]:
    """The package's page files under `/page/`, and the benchmark's page at `/`."""
    handler = functools.partial(_Files, directory=str(PAGE.parent))
    server = http.server.ThreadingHTTPServer((HOST, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(runs: list[dict[str, list[float]]], deltas: int) -> dict[str, Any]:
    """Per kind (script, layout): p50/p90 per frame over the first and last 10%, totals."""
    tenth = max(1, deltas // 10)
    out: dict[str, Any] = {}
    for kind in ("script", "layout"):
        first = [t for run in runs for t in run[kind][:tenth]]
        last = [t for run in runs for t in run[kind][-tenth:]]
        out[kind] = {
            "first_p50_ms": statistics.median(first),
            "first_p90_ms": _quantile(first, 0.9),
            "last_p50_ms": statistics.median(last),
            "last_p90_ms": _quantile(last, 0.9),
            "total_ms": statistics.median(sum(run[kind]) for run in runs),
        }
    return out


def measure(args: argparse.Namespace, text: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with serve_page_files() as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            page.goto(f"{url}/bench.html")
            page.evaluate(MEASURE, {"text": text, "deltas": min(50, args.deltas), "reps": 1})
            result: dict[str, Any] = page.evaluate(
                MEASURE, {"text": text, "deltas": args.deltas, "reps": args.reps}
            )
            result["chromium"] = browser.version
            result["isolated"] = page.evaluate("crossOriginIsolated")
        finally:
            browser.close()
    return result


def report(summary: dict[str, Any], args: argparse.Namespace, raw: dict[str, Any]) -> None:
    print(
        f"\nDrawing a streamed answer — Chromium {raw['chromium']} on {os.cpu_count()} cores, "
        f"{args.chars:,} characters in {args.deltas:,} deltas, {args.reps} runs per mode, "
        f"{raw['nodes']:,} elements at the end, timer "
        f"{'5 µs (cross-origin isolated)' if raw['isolated'] else '100 µs'}\n"
    )
    print(f"{'mode':7} {'timed':15} {'first 10% p50':>14} {'p90':>8} {'last 10% p50':>13} "
          f"{'p90':>8} {'total ms':>10}")  # fmt: skip
    for kind, label in (("script", "script"), ("layout", "script + layout")):
        for mode in ("before", "after"):
            row = summary[mode][kind]
            print(
                f"{mode:7} {label:15} {row['first_p50_ms']:14.3f} {row['first_p90_ms']:8.3f} "
                f"{row['last_p50_ms']:13.3f} {row['last_p90_ms']:8.3f} {row['total_ms']:10.1f}"
            )
    print(
        "\nper-frame figures in ms; before: the whole text drawn again each frame; after: "
        "the blocks still open only. Final DOM of both modes and of a fresh drawing "
        + ("equal." if raw["equal"] else "DIFFER (a bug).")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chars", type=int, default=20_000, help="length of the answer")
    parser.add_argument("--deltas", type=int, default=2_000, help="pieces it streams in")
    parser.add_argument("--reps", type=int, default=3, help="runs per mode (interleaved)")
    parser.add_argument("--chromium", default=CHROMIUM, help="the Chromium binary")
    default_json = Path(__file__).parent / "results" / "page_render.json"
    parser.add_argument("--json", default=str(default_json))
    args = parser.parse_args()
    if args.chars < 1 or args.deltas < 10 or args.reps < 1:
        parser.error("--chars and --reps must be at least 1, --deltas at least 10")
    if not Path(args.chromium).exists():
        parser.error(f"no Chromium at {args.chromium} (apt-get install -y chromium)")

    text = answer(args.chars)
    print("running Chromium …", flush=True)
    raw = measure(args, text)
    summary = {mode: summarise(raw["runs"][mode], args.deltas) for mode in ("before", "after")}
    report(summary, args, raw)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "python": sys.version,
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "chromium": raw["chromium"],
        "cross_origin_isolated": raw["isolated"],
        "ts": datetime.now(UTC).isoformat(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "elements": raw["nodes"],
        "final_dom_equal": raw["equal"],
        "results": summary,
        "frames_ms": raw["runs"],
    }
    out.write_text(json.dumps(payload, indent=2))
    print(f"\nwrote {args.json}")
    if not raw["equal"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
