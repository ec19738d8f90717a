"""What the end-to-end benchmark scripts share: the repository root, running a memfit command
that prints one JSON object, and the CPU's name for the record of where a number was measured."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_json(cmd):
    """Runs cmd and parses its stdout as JSON; exits with its stderr if it fails. `memfit plan`
    exits 3 when the run does not fit --mem-limit, after printing the same JSON: not a failure."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and not (r.returncode == 3 and "plan" in cmd):
        sys.exit(f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr}")
    return json.loads(r.stdout)


def cpu_model(default=""):
    """/proc/cpuinfo's model name, or default where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default


def cpu_flags():
    """/proc/cpuinfo's feature flags of the first CPU (an empty set where there are none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def native_bf16():
    """Whether this CPU multiplies bf16 natively (AVX512_BF16 or AMX-BF16): where the bf16
    targets apply."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def isa_env(isa, torch=False):
    """The environment that makes this machine run as a lesser one (isa "" leaves it as it is):
    MEMFIT_MAX_ISA for memfit, which caps its Highway kernels and oneDNN; for PyTorch, ATen's
    CPU capability, its bundled oneDNN's ISA and OpenBLAS's core type (Haswell: AVX2), so an
    AVX-512 machine can stand in for an AVX2-only one on both sides of a comparison. Without a
    cap OPENBLAS_CORETYPE is unset for PyTorch, so that it runs at its best."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("OPENBLAS_L2_SIZE", None)
    if not isa:
        return env
    if not torch:
        env["MEMFIT_MAX_ISA"] = isa
        return env
    if isa != "avx2":
        sys.exit(f"--isa {isa}: only avx2 has a PyTorch equivalent here")
    env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", DNNL_MAX_CPU_ISA="AVX2",
               OPENBLAS_CORETYPE="Haswell")
    return env
