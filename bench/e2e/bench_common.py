"""What the end-to-end benchmark scripts share: the repository root, running a memfit command
that prints one JSON object, and the CPU's name for the record of where a number was measured."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_json(cmd):
    """Runs cmd and parses its stdout as JSON; exits with its stderr if it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
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
