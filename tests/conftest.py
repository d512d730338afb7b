"""Shared test fixtures: the golden fixture root and a case loader (see tests/fixtures/README.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

MAX_AUTO_WORKERS = 8


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): xdist's count (a worker per core), at most MAX_AUTO_WORKERS, so that a
    many-core host does not start dozens of workers that each build their engines and servers;
    PYTEST_XDIST_AUTO_NUM_WORKERS still sets the number."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    from xdist.plugin import pytest_xdist_auto_num_workers as per_core

    return min(per_core(config), MAX_AUTO_WORKERS)


# Under pytest-xdist (a plain `pytest` runs `-n auto`, .ci/run's variant step `-n 2`) the workers share the
# machine's cores: each worker, and each server subprocess it starts (they inherit the variable), gets its share
# of torch threads, not all of them each.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import torch  # noqa: E402  (after OMP_NUM_THREADS: torch reads it once, when first imported)

if _WORKERS > 1:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def _interpreter_works() -> bool:
    """Triton < 3.7's interpreter turns 1-element arrays into loop bounds, which NumPy >= 2.4 refuses."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        triton_version = tuple(int(p) for p in version("triton").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    numpy_version = tuple(int(p) for p in version("numpy").split(".")[:2])
    return triton_version >= (3, 7) or numpy_version < (2, 4)


# Without a GPU, Triton kernels run in Triton's CPU interpreter (it must be chosen before Triton is
# first imported): the fused-kernel tests then check the very kernels the GPU runs.
if not torch.cuda.is_available() and _interpreter_works():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURES = REPO / "tests" / "fixtures" / "ming_tiny"


def fixtures_root() -> Path:
    """The fixture set under test: $REALTIME_MING_FIXTURES or the in-repo tests/fixtures/ming_tiny."""
    return Path(os.environ.get("REALTIME_MING_FIXTURES", DEFAULT_FIXTURES)).resolve()


@pytest.fixture(scope="session")
def fixture_root() -> Path:
    root = fixtures_root()
    if not (root / "config.json").is_file():
        pytest.fail(f"fixture set not found at {root} (set REALTIME_MING_FIXTURES)")
    return root


def read_case(name: str):
    """(tensors, meta) of case `name`; tensors is {} for json-only cases."""
    from safetensors.torch import load_file

    cases = fixtures_root() / "cases"
    meta = json.loads((cases / f"{name}.json").read_text())
    st = cases / f"{name}.safetensors"
    tensors = load_file(str(st)) if st.exists() else {}
    return tensors, meta


@pytest.fixture(scope="session")
def load_case():
    return read_case


_TOKENIZERS: dict[Path, tuple[str, str]] = {}


def fixture_tokenizers(root: Path) -> tuple[str, str]:
    """(thinker, talker) tokenizer.json paths placed on the special ids of the fixture set at `root` (its
    configs; the talker's <audio>/<audioPatch> from its talker_loop case), written once per session."""
    import tempfile

    from realtime_ming.model.config import load_checkpoint_config
    from realtime_ming.model.tiny_tokenizer import tiny_tokenizers_for

    root = Path(root).resolve()
    if root not in _TOKENIZERS:
        meta = json.loads((root / "cases" / "talker_loop.json").read_text())
        audio = {p["text"]: p["ids"][0] for p in meta["template"]["pieces"] if p["text"] in ("<audio>", "<audioPatch>")}
        folder = Path(tempfile.mkdtemp(prefix="fixture_tokenizers_"))
        paths = []
        for kind, tok in zip(("thinker", "talker"), tiny_tokenizers_for(load_checkpoint_config(root), audio)):
            (folder / kind).mkdir()
            tok.save(str(folder / kind / "tokenizer.json"))
            paths.append(str(folder / kind / "tokenizer.json"))
        _TOKENIZERS[root] = (paths[0], paths[1])
    return _TOKENIZERS[root]


def tiny_engine(**settings):
    """The embedded tiny engine (CPU); `settings` are EngineHooks fields (forced_reply, forced_transcript, ...)
    and ThinkerRunnerConfig fields (max_seq_len, ...)."""
    import dataclasses

    from realtime_ming.engine import Engine
    from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
    from realtime_ming.engine.hooks import EngineHooks

    names = {f.name for f in dataclasses.fields(EngineHooks)}
    hooks = EngineHooks(**{k: v for k, v in settings.items() if k in names})
    thinker = ThinkerRunnerConfig(**{k: v for k, v in settings.items() if k not in names})
    return Engine.create(EngineConfig(thinker=thinker), hooks=hooks)


def tiny_engine_fixture(**settings):
    """A module-scoped `engine` fixture, `tiny_engine(**settings)` closed after the module: a module that
    needs other hooks or thinker settings than the default writes `engine = tiny_engine_fixture(...)`."""

    @pytest.fixture(scope="module")
    def engine():
        eng = tiny_engine(**settings)
        yield eng
        eng.close()

    return engine


# The embedded tiny engine with default settings, shared by one module's tests (a module may define its own).
engine = tiny_engine_fixture()


@pytest.fixture(scope="module")
def tiny_bundle():
    """The embedded tiny model, loaded once per module: engines built on it load nothing."""
    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.models import ModelBundle

    return ModelBundle.load(EngineConfig())


def fresh_engine_fixture():
    """An `engine` fixture giving each test a new default engine on the module's `tiny_bundle`, closed after
    the test: for modules whose tests break, kill or drain their engine. Use `engine = fresh_engine_fixture()`."""

    @pytest.fixture
    def engine(tiny_bundle):
        from realtime_ming.engine import Engine
        from realtime_ming.engine.config import EngineConfig

        eng = Engine(EngineConfig(), tiny_bundle)
        yield eng
        eng.close()

    return engine


@pytest.fixture
async def server(engine):
    """A server with the default config on a free loopback port, serving `engine`."""
    from realtime_ming.server import RealtimeServer, load_config

    async with RealtimeServer(load_config(None, ["server.port=0"]), engine) as srv:
        yield srv


# The fast tier covers every module (tests/tier_support.py): each xdist worker reports the package modules it
# imported, and the run (controller or single process) checks their union after a whole fast-tier run.
_WORKER_MODULES: set[str] = set()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tier_support import KEY

    _WORKER_MODULES.update(getattr(node, "workeroutput", {}).get(KEY, ()))


def pytest_sessionfinish(session, exitstatus):
    from tier_support import KEY, imported_modules, report_missing, whole_fast_tier

    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller checks
        session.config.workeroutput[KEY] = sorted(imported_modules())
    elif whole_fast_tier(session.config):
        report_missing(session, imported_modules() | _WORKER_MODULES)
