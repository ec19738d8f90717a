#!/usr/bin/env python3
"""NVMe offload (issue 15, "Measure"): the disk's sequential bandwidth from fio, a small model's
step time in RAM and offloaded side by side (with its losses checked bit for bit), and a large
run with --offload-optimizer nvme (and --offload-grads nvme unless --grads none) on one fixed
batch (--repeat-batch): RAM peak (pool and RSS), disk bytes, each step's time split into the update, the update's I/O wait and the rest, and the
I/O throughput while the optimizer runs as a fraction of fio's.

Run it on a quiet machine, on the disk to measure (the directory must have room for the large
run's files: `memfit plan` prints them):

    python3 bench/e2e/offload_bench.py --dir /mnt/nvme/memfit-offload
    python3 bench/e2e/offload_bench.py --dir /mnt/nvme/x --model llama2-7b --n-layer 8 --steps 2
    python3 bench/e2e/offload_bench.py --dir /tmp/x --small-only       # the side-by-side alone
    python3 bench/e2e/offload_bench.py --dir /mnt/nvme/x --offload-params  # blocks on disk too
    # the issue's headline: llama2-7b with params, gradients and optimizer all on disk
    python3 bench/e2e/offload_bench.py --dir /mnt/nvme/x --offload-params --model llama2-7b \
        --mem-limit 8GiB --ckpt full

The side-by-side has three rows: in RAM, --offload-optimizer nvme, and both with
--offload-params nvme (the blocks' working weights read per block; Note [NVMe offload],
"Working weights on disk"), each step's wait for the params file, and the losses compared.
With --offload-params the large run (and its --max-model shape) offloads the working weights
too, and its table adds the params file's reads per step, its wait, and the share of those
reads hidden behind compute (1 - wait / (bytes at fio's read rate)).

The large run defaults to the largest LLaMA shape `memfit plan --max-model` finds for
--mem-limit with the optimizer offloaded (--max-model), or the --model given. Training data:
--data (data/brown by default, `memfit prepare brown`). Writes docs/bench/offload.json and
prints a table.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import ROOT, cpu_model, run_json  # noqa: E402

MIB = 1024.0 * 1024.0
GIB = 1024.0 * MIB


def fio(directory, rw, size_gib):
    """Sequential bandwidth in bytes/s (O_DIRECT, 1 MiB blocks, io_uring, queue depth 16)."""
    if not shutil.which("fio"):
        return None
    out = subprocess.run(
        ["fio", "--name=memfit", f"--directory={directory}", f"--rw={rw}", "--bs=1M",
         f"--size={size_gib}G", "--direct=1", "--ioengine=io_uring", "--iodepth=16",
         "--numjobs=1", "--group_reporting", "--output-format=json"],
        check=True, capture_output=True, text=True).stdout
    job = json.loads(out)["jobs"][0]
    for f in os.listdir(directory):
        if f.startswith("memfit."):
            os.remove(os.path.join(directory, f))
    return job["read" if rw == "read" else "write"]["bw_bytes"]


def train(args, extra, log, data=None):
    cmd = [args.memfit, "train", "--data", data or args.data, "--log", log, "--eval-batches", "1",
           "--shuffle", "false"] + extra
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(log) as f:
        return [json.loads(line) for line in f if '"loss"' in line]


def side_by_side(args, tmp):
    """A small model in RAM and offloaded: step times and bit-identical losses."""
    base = ["--model", args.small_model, "--precision", args.precision, "--optim", args.optim,
            "--batch", "4", "--seq-len", "256", "--steps", str(args.small_steps), "--lr", "1e-3"]
    ram = train(args, base, os.path.join(tmp, "ram.jsonl"))
    off = train(args, base + ["--offload-optimizer", "nvme", "--offload-dir", args.dir],
                os.path.join(tmp, "off.jsonl"))
    par = train(args, base + ["--offload-optimizer", "nvme", "--offload-params", "nvme",
                              "--offload-dir", args.dir],
                os.path.join(tmp, "params.jsonl"))
    steady = slice(1, None)  # the first step warms the page cache and the kernels
    return {
        "params_losses_identical": [r["loss"] for r in ram] == [o["loss"] for o in par],
        "params_step_s": statistics.median(o["step_seconds"] for o in par[steady]),
        "params_wait_s": statistics.median(o["offload"]["params"]["wait_seconds"]
                                           for o in par[steady]),
        "params_peak_mib": par[-1]["peak_bytes"] / MIB,
        "model": args.small_model,
        "losses_identical": [r["loss"] for r in ram] == [o["loss"] for o in off],
        "ram_step_s": statistics.median(r["step_seconds"] for r in ram[steady]),
        "offload_step_s": statistics.median(o["step_seconds"] for o in off[steady]),
        "offload_wait_s": statistics.median(o["offload"]["wait_seconds"] for o in off[steady]),
        "ram_peak_mib": ram[-1]["peak_bytes"] / MIB,
        "offload_peak_mib": off[-1]["peak_bytes"] / MIB,
    }


def large_shape(args):
    if args.model:
        shape = ["--model", args.model]
        if args.n_layer:
            shape += ["--n-layer", str(args.n_layer)]
        return shape
    found = run_json([args.memfit, "plan", "--json", "--model", "llama2-7b", "--max-model",
                      "--mem-limit", args.mem_limit, "--precision", args.precision,
                      "--master-weights", args.master_weights, "--optim",
                      args.optim, "--offload-optimizer", "nvme", "--offload-grads", args.grads,
                      "--offload-dir", args.dir, "--grad-dtype", args.grad_dtype,
                      "--batch", str(args.batch), "--seq-len", str(args.seq)]
                     + params_flag(args))["max_model"]
    m = found["best"]
    return ["--model", "llama2-7b", "--n-layer", str(m["n_layer"]), "--d-model",
            str(m["d_model"]), "--n-head", str(m["n_head"]), "--n-kv-head",
            str(m.get("n_kv_head", m["n_head"])), "--ffn-dim", str(m["ffn_dim"]),
            "--ckpt", m["ckpt"]]


def params_flag(args):
    return ["--offload-params", "nvme"] if args.offload_params else []


def large(args, tmp):
    shape = large_shape(args)
    common = shape + ["--precision", args.precision, "--master-weights", args.master_weights,
                      "--optim", args.optim, "--batch",
                      str(args.batch), "--seq-len", str(args.seq), "--offload-optimizer", "nvme",
                      "--offload-grads", args.grads, "--offload-dir", args.dir, "--mem-limit",
                      args.mem_limit, "--grad-dtype", args.grad_dtype] + params_flag(args)
    if "--ckpt" not in common:
        common += ["--ckpt", args.ckpt]
    plan = run_json([args.memfit, "plan", "--json", "--steps", str(args.steps)] + common)
    steps = train(args, common + ["--steps", str(args.steps), "--lr", "1e-4", "--warmup", "0",
                                  "--lr-schedule", "constant", "--repeat-batch"],
                  os.path.join(tmp, "large.jsonl"), data=args.large_data)
    rows = []
    for s in steps:
        o = s["offload"]
        # The update's bytes: the gradients' writes and reads back during the backward are not.
        moved = o["read_bytes"] + o["written_bytes"] - o.get("grads", {}).get("backward_bytes", 0)
        rows.append({"step": s["step"], "loss": s["loss"], "step_s": s["step_seconds"],
                     "update_s": o["update_seconds"], "io_wait_s": o["wait_seconds"],
                     "compute_s": s["step_seconds"] - o["wait_seconds"],
                     "io_gbps_in_update": moved / o["update_seconds"] / 1e9,
                     "pool_peak_mib": s["peak_bytes"] / MIB, "rss_mib": s["rss_bytes"] / MIB})
        if "params" in o:
            rows[-1]["param_read_gib"] = o["params"]["read_bytes"] / GIB
            rows[-1]["param_wait_s"] = o["params"]["wait_seconds"]
    result = {"args": common, "params_m": plan["model"]["params"] / 1e6,
            "planned_peak_mib": plan["peak_bytes"] / MIB,
            "disk_gib": plan["offload"]["disk_bytes"] / GIB,
            "io_gib_per_step": plan["offload"]["io_bytes_per_step"] / GIB, "steps": rows,
            "loss_went_down": steps[-1]["loss"] < steps[0]["loss"]}
    if args.save_resume:
        result["save_resume"] = save_resume(args, tmp, common, steps, plan)
    return result


def max_rss_run(cmd):
    """Runs cmd under /usr/bin/time; returns its maximum resident set size in bytes."""
    out = subprocess.run(["/usr/bin/time", "-f", "maxrss_kib %M"] + cmd, check=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True).stderr
    return int(out.rsplit("maxrss_kib", 1)[1].split()[0]) * 1024


def save_resume(args, tmp, common, reference, plan):
    """The large run saved after steps - 1 steps (model.safetensors streamed from the offload
    files), then resumed for the last step: the resumed step's loss against the uninterrupted
    run's, and the saving process's maximum RSS against the planned pool peak."""
    ckpt = os.path.join(args.dir, "checkpoint")
    shutil.rmtree(ckpt, ignore_errors=True)
    train_args = ["--lr", "1e-4", "--warmup", "0", "--lr-schedule", "constant", "--repeat-batch",
                  "--data", args.large_data, "--eval-batches", "1", "--shuffle", "false"]
    log_a, log_b = os.path.join(tmp, "save.jsonl"), os.path.join(tmp, "resumed.jsonl")
    rss_a = max_rss_run([args.memfit, "train"] + common + train_args +
                        ["--steps", str(args.steps), "--stop-after", str(args.steps - 1),
                         "--save", ckpt, "--log", log_a])
    checkpoint_bytes = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt))
    rss_b = max_rss_run([args.memfit, "train"] + common + train_args +
                        ["--steps", str(args.steps), "--resume", ckpt, "--log", log_b])
    with open(log_a) as f:
        saves = [json.loads(line) for line in f if '"saved"' in line]
    with open(log_b) as f:
        resumed = [json.loads(line) for line in f if '"loss"' in line]
    last = reference[-1]
    shutil.rmtree(ckpt, ignore_errors=True)
    return {"saved_after_step": args.steps - 1, "checkpoint_gib": checkpoint_bytes / GIB,
            "save_seconds": saves[-1].get("save_seconds") if saves else None,
            "max_rss_saving_mib": rss_a / MIB, "max_rss_resumed_mib": rss_b / MIB,
            "planned_peak_mib": plan["peak_bytes"] / MIB,
            "resumed_loss": resumed[-1]["loss"], "uninterrupted_loss": last["loss"],
            "resumed_step": resumed[-1]["step"],
            "bit_identical": resumed[-1]["loss"] == last["loss"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True, help="offload directory on the disk to measure")
    p.add_argument("--memfit", default=os.path.join(ROOT, "build", "memfit"))
    p.add_argument("--data", default=os.path.join(ROOT, "data", "brown"))
    p.add_argument("--large-data", default=os.path.join(ROOT, "data", "brown-llama2"),
                   help="the large (LLaMA) run's shards: `memfit prepare --input brown "
                        "--tokenizer llama2 --out data/brown-llama2`")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--optim", default="adamw8bit")
    p.add_argument("--master-weights", default="fp32",
                   help="the large run's: none (pure bf16) halves its disk bytes beside the "
                        "gradients")
    p.add_argument("--small-model", default="gpt2-small-test")
    p.add_argument("--small-steps", type=int, default=6)
    p.add_argument("--small-only", action="store_true")
    p.add_argument("--model", help="the large run's preset (default: --max-model's shape)")
    p.add_argument("--n-layer", type=int, default=0)
    p.add_argument("--mem-limit", default="16GiB")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--ckpt", default="full")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--grads", default="nvme", choices=["nvme", "none"],
                   help="the large run's --offload-grads (default nvme: no gradient slab in RAM)")
    p.add_argument("--grad-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="the large run's gradients (bf16 halves the gradient file and its I/O)")
    p.add_argument("--fio-gib", type=int, default=8)
    p.add_argument("--offload-params", action="store_true",
                   help="the large run offloads the blocks' working weights too")
    p.add_argument("--save-resume", action="store_true",
                   help="also save the large run after steps - 1 steps and resume it for the "
                        "last (needs room for the checkpoint beside the files)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "bench", "offload.json"))
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    result = {"date": datetime.date.today().isoformat(), "cpu": cpu_model(), "dir": args.dir}
    with tempfile.TemporaryDirectory() as tmp:
        w, r = fio(args.dir, "write", args.fio_gib), fio(args.dir, "read", args.fio_gib)
        result["fio_write_gbps"] = w / 1e9 if w else None
        result["fio_read_gbps"] = r / 1e9 if r else None
        result["side_by_side"] = side_by_side(args, tmp)
        if not args.small_only:
            result["large"] = large(args, tmp)
    if result["fio_read_gbps"]:
        print(f"disk ({args.dir}): fio sequential write {result['fio_write_gbps']:.2f} GB/s, "
              f"read {result['fio_read_gbps']:.2f} GB/s")
    else:
        print("fio is not installed (apt-get install fio): no sequential bandwidth to compare")
    s = result["side_by_side"]
    print(f"{s['model']}: step {s['ram_step_s']:.3f} s in RAM, {s['offload_step_s']:.3f} s "
          f"offloaded ({s['offload_wait_s']:.3f} s waiting for the disk); peak "
          f"{s['ram_peak_mib']:.1f} -> {s['offload_peak_mib']:.1f} MiB; losses identical: "
          f"{s['losses_identical']}")
    print(f"{s['model']} with --offload-params nvme too: step {s['params_step_s']:.3f} s "
          f"({s['params_wait_s']:.3f} s waiting for the params file); peak "
          f"{s['params_peak_mib']:.1f} MiB; losses identical: {s['params_losses_identical']}")
    if "large" in result:
        L = result["large"]
        fio_both = ((result["fio_read_gbps"] + result["fio_write_gbps"]) / 2
                    if result["fio_read_gbps"] else float("nan"))
        print(f"\nlarge run: {L['params_m']:.0f}M parameters, planned peak "
              f"{L['planned_peak_mib']:.0f} MiB, {L['disk_gib']:.1f} GiB on disk, "
              f"{L['io_gib_per_step']:.1f} GiB moved a step; loss went down: "
              f"{L['loss_went_down']}")
        print(f"{'step':>4} {'loss':>8} {'step s':>8} {'update s':>9} {'io wait s':>9} "
              f"{'GB/s':>6} {'of fio':>6} {'pool MiB':>9} {'RSS MiB':>8}")
        for r in L["steps"]:
            print(f"{r['step']:>4} {r['loss']:>8.4f} {r['step_s']:>8.2f} {r['update_s']:>9.2f} "
                  f"{r['io_wait_s']:>9.2f} {r['io_gbps_in_update']:>6.2f} "
                  f"{r['io_gbps_in_update'] / fio_both:>6.0%} {r['pool_peak_mib']:>9.0f} "
                  f"{r['rss_mib']:>8.0f}")
        for r in L["steps"]:
            if "param_read_gib" in r and result["fio_read_gbps"]:
                ideal = r["param_read_gib"] * GIB / (result["fio_read_gbps"] * 1e9)
                hidden = 1 - r["param_wait_s"] / ideal if ideal > 0 else float("nan")
                print(f"step {r['step']}: params file {r['param_read_gib']:.1f} GiB read, "
                      f"{r['param_wait_s']:.2f} s waited, {hidden:.0%} of the reads hidden "
                      f"behind compute")
        if "save_resume" in L:
            sr = L["save_resume"]
            took = f" in {sr['save_seconds']:.1f} s" if sr.get("save_seconds") is not None else ""
            print(f"saved after step {sr['saved_after_step']} ({sr['checkpoint_gib']:.1f} GiB"
                  f"{took}), max RSS {sr['max_rss_saving_mib']:.0f} MiB (planned pool peak "
                  f"{sr['planned_peak_mib']:.0f}); resumed step {sr['resumed_step']} loss "
                  f"{sr['resumed_loss']:.6f}, uninterrupted {sr['uninterrupted_loss']:.6f}: "
                  f"bit-identical {sr['bit_identical']} (max RSS {sr['max_rss_resumed_mib']:.0f})")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
