"""Shared test fixtures: the golden fixture root and a case loader (see ../shared/fixtures/README.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_FIXTURES = REPO.parent / "shared" / "fixtures" / "ming_tiny"


def fixtures_root() -> Path:
    """The fixture set under test: $REALTIME_MING_FIXTURES or ../shared/fixtures/ming_tiny."""
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
