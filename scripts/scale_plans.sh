#!/usr/bin/env bash
# Regenerates the plans in docs/scale.md: runs `memfit plan ... --json` for each of the seed
# documents' configurations and writes its table between the markers
#   <!-- scale_plans NAME begin --> ... <!-- scale_plans NAME end -->
# (the prose around them is hand-written and kept). tests/cli/scale_doc_test.cpp reruns a few
# of these commands, read back from the doc, and checks every figure, so the doc cannot drift.
#
# Usage: bash scripts/scale_plans.sh [MEMFIT_BINARY]   (default build/memfit)
#        bash scripts/scale_plans.sh --print [MEMFIT_BINARY]   (markdown to stdout, doc untouched)
#        bash scripts/scale_plans.sh --only NAME,NAME [MEMFIT_BINARY]   (those blocks alone: the
#        70B layout searches take many minutes on a 2-core host)
#
# Every plan runs with MEMFIT_MAX_ISA=avx512 and --threads 1: the workspace and the LM head's
# chunk depend on whether bf16 GEMMs are native (AVX512_BF16) and the attention workspaces on the
# thread count, so pinning both makes the figures the same on every CPU (docs/scale.md says what
# a native-bf16 CPU changes). --data names no shards, so staging is the loaders' fixed buffers.
# The --auto searches choose the fastest candidate by this CPU's calibration; their choice is
# this host's (the figures of a given choice are not).
set -euo pipefail
cd "$(dirname "$0")/.."
print=0
if [[ "${1:-}" == "--print" ]]; then print=1; shift; fi
only=""
if [[ "${1:-}" == "--only" ]]; then only=$2; shift 2; fi
memfit=${1:-build/memfit}
if [[ ! -x "$memfit" ]]; then
  echo "scale_plans: $memfit not built (bash /work/wt-build.sh memfit)" >&2
  exit 2
fi
doc=docs/scale.md
offload_dir=$(mktemp -d)
trap 'rm -rf "$offload_dir"' EXIT
export MEMFIT_MAX_ISA=avx512
common="--attention flash --threads 1 --data /nonexistent/scale-plans"

seven="--model llama2-7b --seq-len 4096 --batch 1 --grad-accum 16 --precision bf16"
seven+=" --optim adamw8bit"
seventy="--model llama3-70b --seq-len 4096 --batch 1 --grad-accum 8 --precision bf16 --world-size 8"
# torchtitan's 70B: 256 GPUs, global batch 512 (2 sequences a data rank; 8192 tokens assumed)
seventy_256="--model llama3-70b --seq-len 8192 --batch 2 --precision bf16 --world-size 256"
levers="--optim adamw8bit --grad-dtype bf16 --master-weights none"
big="--model llama3.1-405b --seq-len 8192 --batch 1 --precision bf16 --world-size 128"
big_fp8=${big/--precision bf16/--precision fp8}  # the seed's 405B precision
# NAME|ARGS (each a `memfit plan` command line, without the common options above)
plans=(
  "7b-given|$seven --ckpt full"
  "7b-pure|$seven --ckpt full --master-weights none --grad-dtype bf16"
  "7b-auto|$seven --auto --mem-limit 24GiB"
  "7b-auto-offload|$seven --auto --mem-limit 24GiB --offload-dir OFFLOAD_DIR"
  "70b-given|$seventy --zero 3 --ckpt full"
  "70b-levers|$seventy --zero 3 --ckpt full $levers"
  "70b-auto|$seventy --auto --mem-limit 80GiB"
  "70b-auto-8bit|$seventy --auto --mem-limit 80GiB --optim adamw8bit"
  "405b-zero3|$big --zero 3 --ckpt full"
  "405b-zero3-levers|$big --zero 3 --ckpt full $levers"
  "405b-zero1|$big --zero 1 --ckpt full"
  "405b-auto|$big --auto --mem-limit 80GiB"
  "70b-zero3-256|${seventy_256} --zero 3 --ckpt full"
  "405b-zero3-512|${big/--world-size 128/--world-size 512} --zero 3 --ckpt full"
  "70b-torchtitan|${seventy_256/--batch 2/--batch 16} --tp 8 --sp --zero 3 --ckpt full"
  "405b-3d|${big/--batch 1/--batch 1 --grad-accum 16} --tp 8 --sp --pp 4 --zero 1 --ckpt full"
  "405b-3d-fp8|${big_fp8/--batch 1/--batch 1 --grad-accum 16} --tp 8 --sp --pp 4 --zero 1 --ckpt full"
  "405b-3d-fits|${big/--batch 1/--batch 1 --grad-accum 16} --tp 8 --sp --pp 4 --zero 2 --grad-dtype bf16 --ckpt full --mem-limit 80GiB"
)

render=$(mktemp)
trap 'rm -rf "$offload_dir" "$render"' EXIT
for entry in "${plans[@]}"; do
  name=${entry%%|*}
  args=${entry#*|}
  [[ -z "$only" || ",$only," == *",$name,"* ]] || continue
  json=$(mktemp)
  # Exit 3 (does not fit) still prints the whole JSON.
  err=$(mktemp)
  "$memfit" plan ${args//OFFLOAD_DIR/$offload_dir} $common --json > "$json" 2> "$err" || {
    code=$?
    [[ $code == 3 ]] || { echo "scale_plans: $name failed ($code):" >&2; cat "$err" >&2; exit 1; }
  }
  rm -f "$err"
  python3 - "$name" "$args $common" "$json" >> "$render" <<'PY'
import json, sys
name, args, path = sys.argv[1], sys.argv[2], sys.argv[3]
d = json.load(open(path))
cats = ["params", "master", "grads", "optimizer", "activations", "workspace", "comm", "staging"]
gib = lambda b: f"{b / 2**30:.2f}"
out = [f"<!-- scale_plans {name} begin -->",
       f"`MEMFIT_MAX_ISA=avx512 memfit plan {args.replace('OFFLOAD_DIR', 'DIR')}`", ""]
s = d.get("search")
if s is not None:
    choice = s["choice"]
    def options(c):
        opts = [f"--ckpt {c['ckpt']}", f"--act-compress {c['act_compress']}",
                f"--batch {c['batch']} --grad-accum {c['grad_accum']}"]
        if d.get("ranks", 1) > 1 or s.get("searched_zero"): opts.append(f"--zero {c['zero']}")
        for k, opt in [("offload", "--offload-optimizer nvme"),
                       ("offload_params", "--offload-params nvme"),
                       ("offload_grads", "--offload-grads nvme")]:
            if c[k]: opts.append(opt)
        layout = []  # the layout search's choice (plan --auto --world-size N, no --tp/--pp)
        if c.get("tp"):
            layout = [f"--tp {c['tp']}" + (" --sp" if c["sp"] else "") + f" --pp {c['pp']}"]
        return " ".join(opts + c["precision_levers"] + layout)
    if choice is None:
        sm = s["smallest"]
        out.append(f"Nothing fits ({s['candidates_planned']} configurations planned); the "
                   f"smallest is `{options(sm)}`, {gib(sm['peak_bytes'])} GiB, "
                   f"{gib(sm['over_bytes'])} GiB over. Its plan:")
    else:
        out.append(f"Chosen ({s['candidates_planned']} configurations planned): "
                   f"`{options(choice)}`. Its plan:")
    out.append("")
    if s.get("layouts"):
        out.append("The layouts the search tried (tp x pp x dp):")
        out.append("")
        out.extend(f"- {line}" for line in s["layouts"])
        out.append("")
out.append("| rank | " + " | ".join(cats) + " | peak |")
out.append("| --- |" + " ---: |" * (len(cats) + 1))
rows = d.get("per_rank") or [{"rank": 0, "by_category": d["by_category"],
                               "peak_bytes": d["peak_bytes"]}]
# Consecutive ranks whose figures print the same share a row (uneven shards differ by bytes).
groups = []
for r in rows:
    key = (tuple(gib(r["by_category"].get(c, 0)) for c in cats), gib(r["peak_bytes"]))
    if groups and groups[-1][1] == key: groups[-1][0].append(r["rank"])
    else: groups.append(([r["rank"]], key))
for ranks, (vals, peak) in groups:
    label = str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
    out.append(f"| {label} | " + " | ".join(vals) + f" | {peak} |")
out.append("")
c = d.get("comm_per_step")
if c:
    out.append(f"Collectives a step, a rank (GiB): all-reduce {gib(c['all_reduce'])}, "
               f"reduce-scatter {gib(c['reduce_scatter'])}, all-gather {gib(c['all_gather'])} "
               f"({c['psi_multiple']:.2f} x the parameters sent per rank, as a ring). "
               f"Peak at: {d['peak_phase']}.")
else:
    out.append(f"Peak at: {d['peak_phase']}.")
# The tensor group's collectives (each stage's under --pp: the stages' figures differ by their
# blocks, the embeddings and the head) and the pipeline's transfers, when the layout has them.
def size(b):
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"
def tensor_line(t):
    parts = [f"all-reduce {size(t['all_reduce'])} in {t['all_reduce_count']}"]
    if "reduce_scatter" in t:
        parts.append(f"reduce-scatter {size(t['reduce_scatter'])} in "
                     f"{t['reduce_scatter_count']} (their inputs)")
    parts.append(f"gathers {size(t['gathered'])} (the rank's parts)")
    return ", ".join(parts)
tensor = []  # ([stages], line)
for st in d.get("stages", []):
    if "tensor_comm_per_step" in st:
        line = tensor_line(st["tensor_comm_per_step"])
        if tensor and tensor[-1][1] == line: tensor[-1][0].append(st["stage"])
        else: tensor.append(([st["stage"]], line))
if not tensor and "tensor_comm_per_step" in d:
    tensor.append(([], tensor_line(d["tensor_comm_per_step"])))
if tensor:
    def label(s):
        return "" if not s else (f"stage {s[0]}: " if len(s) == 1 else f"stages {s[0]}-{s[-1]}: ")
    out.append("")
    out.append("The tensor group a step, a rank (calls): " +
               "; ".join(label(s) + line for s, line in tensor) + ".")
pt = d.get("pipeline_time")
if pt:
    out.append("")
    out.append(f"Pipeline transfers a step: {size(pt['p2p_bytes_per_step'])} each way at "
               f"each cut ({size(pt['p2p_bytes'])} a micro-batch); the bubble "
               f"{pt['bubble_fraction']:.3f} of the micro-batches' time.")
out.append(f"<!-- scale_plans {name} end -->")
print("\n".join(out))
PY
  rm -f "$json"
done

if (( print )) || [[ ! -f "$doc" ]]; then cat "$render"; exit 0; fi
python3 - "$doc" "$render" <<'PY'
import re, sys
doc_path, render_path = sys.argv[1], sys.argv[2]
doc, render = open(doc_path).read(), open(render_path).read()
blocks = re.findall(r"(<!-- scale_plans (\S+) begin -->.*?<!-- scale_plans \2 end -->)",
                    render, re.S)
for block, name in blocks:
    pattern = re.compile(rf"<!-- scale_plans {re.escape(name)} begin -->.*?"
                         rf"<!-- scale_plans {re.escape(name)} end -->", re.S)
    if not pattern.search(doc):
        sys.exit(f"scale_plans: {doc_path} has no markers for {name}")
    doc = pattern.sub(lambda _: block, doc)
open(doc_path, "w").write(doc)
print(f"scale_plans: {len(blocks)} plans written into {doc_path}")
PY
