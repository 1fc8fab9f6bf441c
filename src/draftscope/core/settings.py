"""Every environment variable the kit reads, passes on or sets, named once: its audience, its type, one line of doc.

Why one module: a variable read in a corner of the tree is a setting nobody can find, and one read twice is read two
ways (`SOURCE_DATE_EPOCH` was parsed by the SBOM and by the image build, each its own way). Here each variable is a
`Variable` with typed accessors, so a bad value is refused by one error that names the variable, the value and the
fix; `docs/settings.md` is generated from this registry (`python -m draftscope settings --output docs/settings.md`)
and a test keeps the committed page equal to it. A test also scans `src/` and refuses any other direct use of
`os.environ` / `os.getenv` / `os.putenv` outside this module, except the listed exceptions.

Reading is lazy (each call reads the environment then), and every accessor takes an optional `environ` mapping in
place of the process's own: callers keep their injectable `environ` parameters, and tests pass a dict. A child
process's environment is built here too: `child_env` (this environment plus the child's own variables) and `named`
(only the variables passed on by name, as a step gets them).

A domain module declares a variable of its own with `declare(Variable(..., owner=__name__))` beside the code that
reads it (the Slurm launcher keeps its job variables under `execute/`); the module is then listed in
`draftscope.__main__.SETTINGS_MODULES` so that the generated page lists its variables too (a test checks the list).

Audiences: `user` (set it to change what the kit does), `kit` (set by the kit for a child process it starts: a
step, a script, the test suite), `tests` (fault injection and test knobs), `upstream` (another program's variable
that the kit reads, passes on or sets: Python, the shell, Hugging Face, Triton, vLLM, CUDA, Docker).

No import of the kit beyond `core.errors`: every layer, the vLLM plugin in the engine's processes included, reads
through this module.

Over ~400 lines on purpose: the point is one place that lists every variable, and the declarations are most of it.
"""

from __future__ import annotations

import contextlib
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from draftscope.core.errors import UserError

Audience = Literal["user", "kit", "tests", "upstream"]
# Each audience's heading and line in docs/settings.md, in the page's order.
AUDIENCES: dict[str, tuple[str, str]] = {
    "user": ("User-facing", "Set these to change what the kit does."),
    "kit": (
        "Set by the kit for a child process",
        "The kit sets these for a process it starts (a step, a script, the test suite); not for users to set.",
    ),
    "tests": ("Tests only", "Fault injection and test knobs."),
    "upstream": (
        "Other programs' variables",
        "Python, the shell, Hugging Face, Triton, vLLM, CUDA and Docker read these; the kit reads them, passes "
        "them on to a step by name, or sets them for one.",
    ),
}

Environ = Mapping[str, str]


def _environ(environ: Environ | None) -> Environ:
    return os.environ if environ is None else environ


def _writable(environ: MutableMapping[str, str] | None) -> MutableMapping[str, str]:
    return os.environ if environ is None else environ


# --- kinds: how a value is read ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """How a variable's text becomes a value: `parse` raises ValueError on a bad one; `message` and `fix` are what
    the error says then (the fix follows "unset NAME or …")."""

    label: str
    parse: Callable[[str], Any]
    message: str
    fix: str


def _text(raw: str) -> str:
    return raw.strip()


def _integer(raw: str) -> int:
    return int(raw)


def _positive(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError(raw)
    return value


def _seconds(raw: str) -> int:
    if not raw.strip().isdigit():
        raise ValueError(raw)
    return int(raw)


AS_TEXT = Kind("text", _text, "not a text value", "give a value")
AS_PATH = Kind("path", Path, "not a path", "give a path")
AS_INTEGER = Kind("integer", _integer, "not an integer", "give an integer")
AS_POSITIVE = Kind("integer > 0", _positive, "must be a positive integer", "give N > 0")
AS_SECONDS = Kind("Unix seconds", _seconds, "not a Unix time in seconds", "export seconds")


def choice(mapping: Mapping[str, Any], *, message: str = "not one of the accepted values") -> Kind:
    """One of `mapping`'s keys (case-insensitive), read as its value."""
    words = dict(mapping)

    def parse(raw: str) -> Any:
        key = raw.strip().lower()
        if key not in words:
            raise ValueError(raw)
        return words[key]

    return Kind(" | ".join(words), parse, message, f"use one of {', '.join(sorted(words))}")


def pattern(regex: str, label: str, *, message: str) -> Kind:
    """A value matching `regex` entirely, read as its groups (the whole value when it has none)."""
    compiled = re.compile(regex)

    def parse(raw: str) -> Any:
        match = compiled.fullmatch(raw.strip())
        if match is None:
            raise ValueError(raw)
        return match.groups() if compiled.groups else match.group(0)

    return Kind(label, parse, message, f"use {label}")


AS_FLAG = choice({"0": False, "1": True}, message="not 0 or 1")


# --- a variable ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, audience, one line of doc, how its value is read and what unset means.

    Unset and blank (whitespace only) are the same: `get` returns `default`. A value `kind` cannot read is a
    UserError naming the variable, the value and the fix; with `strict=False` (a variable whose reader always
    ignored a malformed value) it reads as `default` instead. A `name` ending in `*` is a family (`TRITON_*`)."""

    name: str
    doc: str
    audience: Audience
    kind: Kind = AS_TEXT
    default: Any = None
    unset: str = ""  # what unset means, for the docs, when `default` alone does not say it
    strict: bool = True
    owner: str = __name__  # the module that declared it

    @property
    def is_family(self) -> bool:
        return self.name.endswith("*")

    def raw(self, environ: Environ | None = None) -> str | None:
        """The value exactly as set, or None."""
        return _environ(environ).get(self.name)

    def is_set(self, environ: Environ | None = None) -> bool:
        """Set at all, even to an empty value (what a container engine's `--env NAME` passes on)."""
        return self.name in _environ(environ)

    def text(self, environ: Environ | None = None) -> str:
        """The value stripped of surrounding blanks; "" when unset."""
        return (self.raw(environ) or "").strip()

    def get(self, environ: Environ | None = None) -> Any:
        """The typed value, or `default` when unset or blank; a bad value is a UserError (see the class)."""
        raw = self.raw(environ)
        if raw is None or not raw.strip():
            return self.default
        try:
            return self.kind.parse(raw)
        except ValueError:
            if not self.strict:
                return self.default
            raise UserError(
                self.kind.message, field=self.name, value=raw, fix=f"unset {self.name} or {self.kind.fix}"
            ) from None

    def set(self, value: str, environ: MutableMapping[str, str] | None = None) -> None:
        """Set it in this process (a library the process imports later reads it) or in `environ`."""
        _writable(environ)[self.name] = value

    def names(self, environ: Environ | None = None) -> list[str]:
        """A family's members that are set, sorted."""
        prefix = self.name.rstrip("*")
        return sorted(n for n in _environ(environ) if n.startswith(prefix))

    def shown_default(self) -> str:
        """What unset means, for the docs."""
        if self.unset:
            return self.unset
        if self.default is None:
            return "—"
        if isinstance(self.default, bool):
            return f"`{int(self.default)}`"
        return f"`{self.default}`"


_REGISTRY: dict[str, Variable] = {}


def declare(variable: Variable) -> Variable:
    """Register `variable` (its module is imported once, but a re-import declares the same one again)."""
    known = _REGISTRY.get(variable.name)
    if known is not None and known != variable:
        raise ValueError(f"{variable.name} is declared twice: in {known.owner} and in {variable.owner}")
    _REGISTRY[variable.name] = variable
    return variable


def variables() -> tuple[Variable, ...]:
    """Every declared variable, by audience (as `AUDIENCES` orders them), then name."""
    order = list(AUDIENCES)
    return tuple(sorted(_REGISTRY.values(), key=lambda v: (order.index(v.audience), v.name)))


def lookup(name: str) -> Variable:
    """The declared variable `name` (a bug when there is none: every name the kit uses is declared here)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in draftscope.core.settings") from None


def _var(name: str, audience: Audience, doc: str, kind: Kind = AS_TEXT, **more: Any) -> Variable:
    return declare(Variable(name, doc, audience, kind, **more))


# --- child processes ----------------------------------------------------------------------------------------------


def child_env(extra: Mapping[str, str] | None = None, *, environ: Environ | None = None) -> dict[str, str]:
    """This process's whole environment with `extra` on top: what a child the kit starts on this machine inherits
    (a script of the checkout, a pytest or invoke run, a server of a stage). A step gets `named` variables only."""
    return {**_environ(environ), **(extra or {})}


def named(names: Iterable[str], environ: Environ | None = None) -> dict[str, str]:
    """The values of those of `names` that are set: the variables a step receives by name from this environment."""
    env = _environ(environ)
    return {name: env[name] for name in names if name in env}


def present(names: Iterable[str], environ: Environ | None = None) -> list[str]:
    """Those of `names` that are set, sorted: passed to a container by name (the engine copies the value)."""
    env = _environ(environ)
    return sorted({name for name in names if name in env})


def masked(text: str | None, names: Iterable[str], environ: Environ | None = None) -> str | None:
    """`text` with the value of each of `names` that is set replaced by `$NAME`, and a password inside such a value
    (a proxy's `scheme://user:password@host`) by `$NAME:password`: what a step given them by name printed, fit to
    quote in a manifest (values of under four characters are left, too short to tell from other text)."""
    if not text:
        return text
    values = []
    for name, value in named(names, environ).items():
        values.append((value, f"${name}"))
        with contextlib.suppress(ValueError):
            if (password := urllib.parse.urlsplit(value).password) is not None:
                values.append((password, f"${name}:password"))
    for value, shown in sorted(values, key=lambda pair: -len(pair[0])):
        if len(value) >= 4:
            text = text.replace(value, shown)
    return text


# --- user-facing -------------------------------------------------------------------------------------------------

DRAFTSCOPE_PRESETS = _var(
    "DRAFTSCOPE_PRESETS",
    "user",
    "a folder of presets (`models/`, `experiments/`) read instead of the kit's own",
    AS_PATH,
    unset="the kit's `presets/`",
)
DRAFTSCOPE_IMAGES_LOCK = _var(
    "DRAFTSCOPE_IMAGES_LOCK",
    "user",
    "an images lock read instead of the checkout's (a reviewer's copy naming where the images were published; "
    "`make kick-the-tires` sets it for its checks)",
    AS_PATH,
    unset="`images/images.lock.json`",
)
DRAFTSCOPE_TRAIN_PYTHON = _var(
    "DRAFTSCOPE_TRAIN_PYTHON",
    "user",
    "`invoke demo`: the python of an environment with speculators, for the pipeline's train stage "
    "(`--train-python` wins; `make demo` passes `--train-python`)",
    unset="`--train-python` is needed",
)
DRAFTSCOPE_RELEASE_CACHE = _var(
    "DRAFTSCOPE_RELEASE_CACHE",
    "user",
    "where the contract tier keeps the released wheels it reads (vLLM, SGLang, speculators)",
    AS_PATH,
    unset="`~/.cache/draftscope/releases`",
)
DRAFTSCOPE_RELIABILITY_SEED = _var(
    "DRAFTSCOPE_RELIABILITY_SEED",
    "user",
    "`invoke reliability`: the seed of the random kill points when `--seed` is not given (set for the suite too)",
    AS_INTEGER,
    default=9,
)
DRAFTSCOPE_TRITON_AOT_CACHE = _var(
    "DRAFTSCOPE_TRITON_AOT_CACHE",
    "user",
    "the prefix head's ahead-of-time Triton kernels: another folder to seed the engine's cache from; `0` turns "
    "the seeding off",
    unset="the vllm image's folder (`head.triton_cache.IMAGE_CACHE`)",
)
DRAFTSCOPE_PREFIX_SHADOW = _var(
    "DRAFTSCOPE_PREFIX_SHADOW",
    "user",
    "prefix head: `1` also runs the dense head every step and counts disagreements (passed on into the step)",
    AS_FLAG,
    default=False,
)
DRAFTSCOPE_PREFIX_K = _var(
    "DRAFTSCOPE_PREFIX_K",
    "user",
    "prefix head: candidates refined exactly per row (passed on into the step)",
    AS_POSITIVE,
    default=64,  # = draftscope.head.certify.DEFAULT_K (not imported: that module needs torch)
)
DRAFTSCOPE_PREFIX_GROUP_SIZE = _var(
    "DRAFTSCOPE_PREFIX_GROUP_SIZE",
    "user",
    "prefix head: the INT8 scale group size (passed on into the step)",
    AS_POSITIVE,
    unset="one scale per row",
)
DRAFTSCOPE_PREFIX_READ_EVERY = _var(
    "DRAFTSCOPE_PREFIX_READ_EVERY",
    "user",
    "prefix head: read the device counters (and rewrite the status) every N steps (passed on into the step)",
    AS_POSITIVE,
    default=64,
)
DRAFTSCOPE_PREFIX_MAX_ROWS = _var(
    "DRAFTSCOPE_PREFIX_MAX_ROWS",
    "user",
    "prefix head: steps with more logits rows take the dense head (passed on into the step)",
    AS_POSITIVE,
    default=64,  # 4 requests of a 16-row DFlash verification
)
CUDA_ARCH = _var(
    "CUDA_ARCH",
    "user",
    "`invoke images.build vllm`: the CUDA architectures to build the extension for, e.g. `9.0` or `8.0;9.0` "
    "(`--cuda-arch` wins)",
    unset="the host GPUs' compute capabilities",
)

# --- set by the kit for a child ----------------------------------------------------------------------------------

DRAFTSCOPE_EXPERIMENTAL_PREFIX = _var(
    "DRAFTSCOPE_EXPERIMENTAL_PREFIX",
    "kit",
    "the vLLM prefix-head plugin's switch, set in a benchmark step with `experimental_prefix: true`: `prefix` "
    "(or `1`), `dense`, or `0` / unset for off",
    choice(
        {"0": None, "1": "prefix", "prefix": "prefix", "dense": "dense"}, message="unknown prefix-head mode"
    ),
    unset="off",
)
DRAFTSCOPE_PREFIX_STATUS = _var(
    "DRAFTSCOPE_PREFIX_STATUS",
    "kit",
    "the status file (JSON) the prefix-head plugin writes, in the step's run directory",
    AS_PATH,
    unset="no status file",
)
DRAFTSCOPE_GIT_COMMIT = _var(
    "DRAFTSCOPE_GIT_COMMIT",
    "kit",
    "a checkout copy without its `.git` (a lent GPU machine): the kit's commit as its sender stated it; read only "
    "without `.git`, ignored unless 40 lowercase hex digits (`tests/gpu/gpu_check.sh` sets it)",
    pattern(r"[0-9a-f]{40}", "40 hex digits", message="not a full commit SHA"),
    strict=False,
    unset="no commit recorded",
)
DRAFTSCOPE_GIT_DIRTY = _var(
    "DRAFTSCOPE_GIT_DIRTY",
    "kit",
    "with `DRAFTSCOPE_GIT_COMMIT`: `1` when the copy had uncommitted changes, `0` when not; other values are ignored",
    AS_FLAG,
    strict=False,
    unset="unknown",
)
DRAFTSCOPE_RELIABILITY_FIGURES = _var(
    "DRAFTSCOPE_RELIABILITY_FIGURES",
    "kit",
    "`invoke reliability`: the file the suite's processes write their tallies to",
    AS_PATH,
)
DRAFTSCOPE_ENGINE_DIR = _var(
    "DRAFTSCOPE_ENGINE_DIR",
    "kit",
    "`images/local/podman-engine.sh`: the second engine's folder (socket, pid, log)",
    AS_PATH,
)
DRAFTSCOPE_ENGINE_STORAGE = _var(
    "DRAFTSCOPE_ENGINE_STORAGE",
    "kit",
    "`images/local/podman-engine.sh`: the second engine's own image storage (a reviewer's empty machine)",
    AS_PATH,
)
DRAFTSCOPE_REGISTRY = _var(
    "DRAFTSCOPE_REGISTRY",
    "kit",
    "the loopback registry's address, as `images/local/registry.sh start` prints it (`export …`); the kit reads "
    "it from that line",
)
PYTHONUNBUFFERED = _var(
    "PYTHONUNBUFFERED",
    "kit",
    "`1` in every child process, so that its log lines arrive as they are written",
)

# --- tests only --------------------------------------------------------------------------------------------------

DRAFTSCOPE_TEST_JOB_TIME_S = _var(
    "DRAFTSCOPE_TEST_JOB_TIME_S",
    "tests",
    "a benchmark's batch job gets this time limit (seconds, in whole minutes) instead of its steps' limits summed: "
    "the time-limit tests of the batch launcher",
    AS_POSITIVE,
    unset="the steps' limits summed",
)
DRAFTSCOPE_FAILPOINT = _var(
    "DRAFTSCOPE_FAILPOINT",
    "tests",
    "fault injection in the benchmark worker: `after-records:N:exit:CODE` ends it with CODE once N records are "
    "written; `repeat:R:change-token:P` changes the token at position P of every generation of repeat R (0-based), "
    "as an engine that altered the target's greedy output would; passed on into steps and noted in the manifest",
    pattern(
        r"after-records:(\d+):exit:(\d+)|repeat:(\d+):change-token:(\d+)",
        "after-records:N:exit:CODE or repeat:R:change-token:P",
        message="malformed fault-injection spec",
    ),
    unset="no fault",
)
DRAFTSCOPE_FUZZ_EXAMPLES = _var(
    "DRAFTSCOPE_FUZZ_EXAMPLES",
    "tests",
    "the reliability suite: generated hostile values per option",
    AS_INTEGER,
    default=8,
)

# --- upstream ----------------------------------------------------------------------------------------------------

PATH = _var("PATH", "upstream", "passed on to a local step")
LANG = _var("LANG", "upstream", "passed on to a local step")
LC_ALL = _var("LC_ALL", "upstream", "passed on to a local step")
TMPDIR = _var("TMPDIR", "upstream", "passed on to a local step")
PYTHONPATH = _var("PYTHONPATH", "upstream", "passed on to a local step")
HOME = _var(
    "HOME",
    "upstream",
    "passed on to a local step; a container step gets `/tmp/home` (its tmpfs); Triton's default cache is under it",
)
XDG_CACHE_HOME = _var("XDG_CACHE_HOME", "upstream", "set in a container step, under its tmpfs")
TORCH_HOME = _var("TORCH_HOME", "upstream", "set in a container step, under its tmpfs")
VLLM_CACHE_ROOT = _var("VLLM_CACHE_ROOT", "upstream", "set in a container step, under its tmpfs")
TZ = _var("TZ", "upstream", "passed on to every step by name")
OMP_NUM_THREADS = _var(
    "OMP_NUM_THREADS",
    "upstream",
    "passed on to every step by name: CPU runs side by side keep from oversubscribing the cores",
)
CUDA_VISIBLE_DEVICES = _var(
    "CUDA_VISIBLE_DEVICES",
    "upstream",
    "passed on to every step by name; set for each server and the train stage to the GPUs it owns",
)
NVIDIA_VISIBLE_DEVICES = _var("NVIDIA_VISIBLE_DEVICES", "upstream", "passed on to every step by name")
HF_TOKEN = _var(
    "HF_TOKEN",
    "upstream",
    "a Hugging Face credential: passed by name to the fetch step only (never into an argv, a log or a manifest)",
)
HUGGING_FACE_HUB_TOKEN = _var(
    "HUGGING_FACE_HUB_TOKEN", "upstream", "the older name of `HF_TOKEN`, passed on the same way"
)
HF_ENDPOINT = _var(
    "HF_ENDPOINT",
    "upstream",
    "a hub mirror's address for huggingface_hub: passed by name to the fetch step only (the manifest and the dry run "
    "name it, never its value)",
)
HTTPS_PROXY = _var(
    "HTTPS_PROXY",
    "upstream",
    "a proxy for the fetch step's downloads (`https_proxy`, `HTTP_PROXY`, `http_proxy` likewise): passed by name to "
    "the fetch step only, never its value recorded (a proxy address may hold a password)",
)
NO_PROXY = _var(
    "NO_PROXY",
    "upstream",
    "hosts the fetch step reaches without the proxy (`no_proxy` likewise): passed by name to the fetch step only",
)
https_proxy = _var("https_proxy", "upstream", "as `HTTPS_PROXY`: passed by name to the fetch step only")
HTTP_PROXY = _var(
    "HTTP_PROXY", "upstream", "as `HTTPS_PROXY`, for http:// addresses (an `HF_ENDPOINT` mirror)"
)
http_proxy = _var("http_proxy", "upstream", "as `HTTP_PROXY`: passed by name to the fetch step only")
no_proxy = _var("no_proxy", "upstream", "as `NO_PROXY`: passed by name to the fetch step only")
HF_HOME = _var(
    "HF_HOME",
    "upstream",
    "Hugging Face's home: the host's hub cache is `$HF_HOME/hub` unless `HF_HUB_CACHE` is set",
    AS_PATH,
    unset="`~/.cache/huggingface`",
)
HF_HUB_CACHE = _var(
    "HF_HUB_CACHE",
    "upstream",
    "where hub downloads land on the host; set in each step to the mounted cache",
    AS_PATH,
    unset="`$HF_HOME/hub`",
)
HF_HUB_OFFLINE = _var(
    "HF_HUB_OFFLINE",
    "upstream",
    "`1` in every step that loads a model (and in the tiny models' check): nothing is fetched from the hub",
)
TRANSFORMERS_OFFLINE = _var(
    "TRANSFORMERS_OFFLINE", "upstream", "`1` with `HF_HUB_OFFLINE`, for older libraries"
)
SOURCE_DATE_EPOCH = _var(
    "SOURCE_DATE_EPOCH",
    "upstream",
    "reproducible builds: the time an image build and its SBOM are dated with",
    AS_SECONDS,
    unset="the commit time (build), now (SBOM)",
)
DOCKER_HOST = _var(
    "DOCKER_HOST",
    "upstream",
    "the engine's API socket; `make kick-the-tires` sets it for its checks to the reviewer engine's",
)
TRITON_HOME = _var(
    "TRITON_HOME", "upstream", "Triton's home: its default cache is `$TRITON_HOME/.triton/cache`"
)
TRITON_CACHE_DIR = _var(
    "TRITON_CACHE_DIR",
    "upstream",
    "Triton's kernel cache: set in a container step (its tmpfs), by the engine's plugin before the first compile "
    "(seeded from the image), and by `head-aot` to the folder it fills",
    unset="`$TRITON_HOME/.triton/cache`, else `~/.triton/cache`",
)
TRITON_INTERPRET = _var(
    "TRITON_INTERPRET",
    "upstream",
    "Triton's interpreter: the head's kernels then run on CPU tensors (tests); read as Triton does",
    choice({"1": True, "true": True, "on": True, "yes": True}),
    default=False,
    strict=False,
)
TRITON_FAMILY = _var(
    "TRITON_*",
    "upstream",
    "every other Triton variable that is set enters a kernel's cache key: the engine's plugin reports those that "
    "differ from the image's build",
)
VLLM_CPU_KVCACHE_SPACE = _var(
    "VLLM_CPU_KVCACHE_SPACE",
    "upstream",
    "vLLM's CPU engine: the KV cache in GiB; the kit sets `1` when unset (recorded in the run's facts)",
    unset="`1` (set by the kit)",
)
SGLANG_USE_CPU_ENGINE = _var(
    "SGLANG_USE_CPU_ENGINE",
    "upstream",
    "SGLang's CPU engine: the kit sets `1` on the servers of the serve and bench stages on a CPU (and the "
    "sglang-cpu image sets it)",
    unset="`1` on those servers (set by the kit)",
)


# --- the generated page -------------------------------------------------------------------------------------------

PAGE = "docs/settings.md"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def markdown(found: Iterable[Variable] | None = None) -> str:
    """`docs/settings.md`: one table per audience."""
    chosen = variables() if found is None else tuple(found)
    lines = [
        "# Environment variables",
        "",
        "<!-- Generated from src/draftscope/core/settings.py by `python -m draftscope settings --output "
        "docs/settings.md`; tests/unit/core/test_settings.py checks that this page equals it. Edit the module, "
        "not this page. -->",
        "",
        "Every environment variable the kit reads, passes on to a step, or sets for a child process. A blank value "
        "counts as unset; a value the kit cannot read is refused with an error naming the variable, the value and "
        "the fix.",
    ]
    for audience, (title, about) in AUDIENCES.items():
        rows = [v for v in chosen if v.audience == audience]
        if not rows:
            continue
        lines += [
            "",
            f"## {title}",
            "",
            about,
            "",
            "| variable | type | unset | what it does |",
            "|---|---|---|---|",
        ]
        for v in rows:
            owner = "" if v.owner == __name__ else f" (declared in `{v.owner}`)"
            lines.append(
                f"| `{v.name}` | {_cell(v.kind.label)} | {_cell(v.shown_default())} | {_cell(v.doc)}{owner} |"
            )
    return "\n".join(lines) + "\n"
