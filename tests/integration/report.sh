#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `dptrain report` (issue 16) on a short real run: 2 ranks train an MLP on generated data, the
# report is written (HTML, and PNG + SVG charts), then opened in headless Chromium: no console
# message may appear, the script must have run, a screenshot is taken, and the numbers the page
# shows (final accuracy, steps, ranks) must equal those in metrics.jsonl. Then the inputs the
# issue lists: a missing directory, an empty or cut metrics.jsonl, lines of an older dptrain, a
# failed run. Skipped (exit 77) without chromium (scripts/install-deps.sh installs it).
# DPTRAIN_REPORT_SHOT=FILE keeps a copy of the screenshot there.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $CHROMIUM ]]; then
  echo "SKIP: chromium is not installed (scripts/install-deps.sh installs it)"
  exit 77
fi

# Fashion-MNIST when converted (make data): real learning curves; generated data otherwise.
if [[ -f $DPTRAIN_DATA/fmnist/train.h5 && -f $DPTRAIN_DATA/fmnist/test.h5 ]]; then
  data=("train = \"$DPTRAIN_DATA/fmnist/train.h5\"" "test = \"$DPTRAIN_DATA/fmnist/test.h5\""
    "mean = [0.2860]" "std = [0.3530]")
  epochs=3
else
  echo "note: $DPTRAIN_DATA/fmnist is missing (make data): training on generated data"
  data=('train = "synthetic"' 'test = "synthetic"' "synthetic_samples = 4096")
  epochs=2
fi
{
  printf 'run_dir = "%s"\nseed = 3\n\n[model]\nname = "mlp"\nclasses = 10\n\n[data]\n' "$TMP/run"
  printf '%s\n' "${data[@]}" "workers = 1"
  printf '\n[train]\nepochs = %s\nglobal_batch = 128\nlr = 0.05\nlog_every_steps = 10\n' "$epochs"
  printf '\n[checkpoint]\nevery_epochs = 0\n'
} >"$TMP/run.toml"

CASE="a 2-rank training run ($epochs epochs)"
expect_ok -- "${MPI2[@]}" "$DPTRAIN" train --config "$TMP/run.toml"

CASE="dptrain report RUN_DIR --format png"
expect_ok -- "$DPTRAIN" report "$TMP/run" --format png
check "it prints the page's path" grep -q "^report: $TMP/run/report.html" "$TMP/last.out"
check "report.html is under 2 MB" test "$(stat -c %s "$TMP/run/report.html")" -lt 2000000
if command -v rsvg-convert >/dev/null; then
  check "the charts are written as PNG and SVG" \
    bash -c "test -s '$TMP/run/report-charts/loss-steps.png' && \
             test -s '$TMP/run/report-charts/time-split.svg' && \
             test \$(ls '$TMP/run/report-charts/'*.png | wc -l) -ge 10"
else
  skip "PNG charts: rsvg-convert is not installed (librsvg2-bin)"
fi

# Headless Chromium: the DOM after the page's script ran, the console, and a screenshot.
browse() { # browse OUT_PREFIX FILE
  local profile=$TMP/chromium-profile
  timeout -k 5 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$profile" --enable-logging=stderr --v=0 --window-size=1280,3600 \
    --hide-scrollbars --dump-dom "file://$2" >"$1.dom" 2>"$1.console" </dev/null
  timeout -k 5 60 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$profile" --enable-logging=stderr --v=0 --window-size=1280,3600 \
    --hide-scrollbars --screenshot="$1.png" "file://$2" >/dev/null 2>>"$1.console" </dev/null
}
browse "$TMP/page" "$TMP/run/report.html"
check "the browser logs no console message (errors, warnings, failed loads)" \
  bash -c "! grep -E 'CONSOLE|Uncaught|ERR_FILE|net::' '$TMP/page.console'"
grep -E 'CONSOLE|Uncaught|net::' "$TMP/page.console" | head -n 5
check "the screenshot was taken" test -s "$TMP/page.png"
[[ -n ${DPTRAIN_REPORT_SHOT:-} ]] && cp "$TMP/page.png" "$DPTRAIN_REPORT_SHOT"
check "the page's numbers equal metrics.jsonl (final accuracy, steps, ranks; script ran)" \
  python3 - "$TMP/page.dom" "$TMP/run/metrics.jsonl" <<'EOF2'
import html.parser, json, sys
recs = [json.loads(l) for l in open(sys.argv[2])]
start = [r for r in recs if r["kind"] == "start"][-1]
evals = [r for r in recs if r["kind"] == "eval"]
last_step = max(r["step"] for r in recs)

class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.tiles, self.key, self.td, self.tile, self.text = {}, {}, None, False, None, ""
        self.body, self.svgs = {}, 0
    def handle_starttag(self, tag, a):
        a = dict(a)
        if tag == "body": self.body = a
        if tag == "svg": self.svgs += 1
        if tag == "tr" and "data-key" in a: self.key = a["data-key"]
        if tag == "td" and self.key: self.td, self.value, self.text = True, a.get("data-value"), ""
        if tag == "div" and a.get("class") == "tile": self.tile, self.text = a["data-key"], ""
    def handle_endtag(self, tag):
        if tag == "td" and self.td:
            self.rows[self.key] = (self.text.strip(), self.value); self.td = False
        if tag == "tr": self.key = None
        if tag == "b" and self.tile: self.tiles[self.tile] = self.text.strip(); self.tile = None
    def handle_data(self, d): self.text += d

p = Page(); p.feed(open(sys.argv[1]).read())
errors = []
def expect(what, got, want):
    if got != want: errors.append(f"{what}: page shows {got!r}, metrics.jsonl says {want!r}")
acc = evals[-1]["test_accuracy"]
expect("final accuracy (data-value)", float(p.rows["final_accuracy"][1]), acc)
expect("final accuracy (text)", p.rows["final_accuracy"][0].split()[0], f"{acc:.4f}")
expect("final accuracy (tile)", p.tiles.get("final_accuracy"), f"{100 * acc:.2f}%")
expect("steps", p.rows["steps"][0], str(last_step))
expect("steps (tile)", p.tiles.get("steps"), str(last_step))
expect("ranks", p.rows["ranks"][0], str(start["world_size"]))
expect("ranks (tile)", p.tiles.get("ranks"), str(start["world_size"]))
expect("status", p.rows["status"][0], "finished")
expect("charts counted by the page's script", p.body.get("data-charts"), str(p.svgs))
if p.svgs < 10: errors.append(f"only {p.svgs} charts")
print(f"page: {p.svgs} charts, accuracy {p.rows['final_accuracy'][0]}, steps {p.rows['steps'][0]}, "
      f"ranks {p.rows['ranks'][0]}")
for e in errors: print("  " + e)
sys.exit(1 if errors else 0)
EOF2

# ---- bad input ----
CASE="a missing directory alone: exit 2"
expect_fail 2 "no metrics to show; $TMP/nope: no such directory" -- "$DPTRAIN" report "$TMP/nope"

mkdir -p "$TMP/empty"
: >"$TMP/empty/metrics.jsonl"
CASE="an empty metrics.jsonl alone: exit 2"
expect_fail 2 "$TMP/empty: no usable record in metrics.jsonl" -- "$DPTRAIN" report "$TMP/empty"

CASE="a run and a missing directory: the run is rendered, the missing one named"
expect_ok -- "$DPTRAIN" report "$TMP/run" "$TMP/nope" --out "$TMP/two.html"
check "the skipped directory is named on stderr" grep -q "skipped: $TMP/nope: no such directory" \
  "$TMP/last.err"
check "... and in the page" grep -q "$TMP/nope: no such directory" "$TMP/two.html"

# A run still being written (its last line cut mid-write) from an older dptrain (no start
# record, no phase split, no per-rank fields).
mkdir -p "$TMP/old"
python3 - "$TMP/run/metrics.jsonl" "$TMP/old/metrics.jsonl" <<'EOF2'
import json, sys
keep = {"kind", "step", "epoch", "time_s", "loss", "lr", "samples_per_s", "test_loss", "test_accuracy"}
out = open(sys.argv[2], "w")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] in ("start", "summary"): continue
    out.write(json.dumps({k: v for k, v in r.items() if k in keep}) + "\n")
out.write('{"kind": "step", "step": 999, "lo')
EOF2
CASE="an older, still-running run with a cut last line: rendered, exit 0"
expect_ok -- "$DPTRAIN" report "$TMP/old"
check "the cut line is reported" grep -q "the last line is incomplete" "$TMP/last.err"
check "the missing fields are reported" grep -q "no time split or per-rank timing" "$TMP/last.err"
check "the page says the run has no summary yet" grep -q "no summary yet" "$TMP/old/report.html"
browse "$TMP/old-page" "$TMP/old/report.html"
check "the older run's page logs no console message" \
  bash -c "! grep -E 'CONSOLE|Uncaught' '$TMP/old-page.console'"

# A failed run: an infinite gradient in fp32 stops it (exit 3) with an "error" record.
CASE="a run that fails at step 5"
sed "s|$TMP/run\"|$TMP/failed\"|" "$TMP/run.toml" >"$TMP/failed.toml"
DPTRAIN_TEST_INF_GRAD=1:4 expect_fail 3 "non-finite gradient at step 5" -- \
  "${MPI2[@]}" "$DPTRAIN_HOOKED" train --config "$TMP/failed.toml"
CASE="the failed run's report"
expect_ok -- "$DPTRAIN" report "$TMP/failed"
check "it shows where the run failed and the error" \
  bash -c "grep -q 'failed after step 4 (exit 3)' '$TMP/failed/report.html' && \
           grep -q 'non-finite gradient at step 5' '$TMP/failed/report.html'"

CASE="two runs overlaid"
expect_ok -- "$DPTRAIN" report "$TMP/run" "$TMP/failed" --out "$TMP/both.html"
check "the table shows the differing status, hides equal keys" \
  bash -c "grep -q 'data-key=\"status\"' '$TMP/both.html' && grep -q 'equal in every run' '$TMP/both.html'"

finish
