"""`twinkle` is the seed-named public face of `twinkle_core`: the same objects, never copies."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import twinkle
import twinkle_core

# The public module pairs: each twinkle module re-exports its twinkle_core twin's public names.
MODULES = ["model", "dataloader", "dataset", "remote", "checkpoint", "assets"]


def test_top_level_names_are_twinkle_core_objects() -> None:
    assert set(twinkle.__all__) >= {"DeviceMesh", "initialize", "remote_class", "shutdown"}
    for name in twinkle.__all__:
        assert getattr(twinkle, name) is getattr(twinkle_core, name), name
    with pytest.raises(AttributeError):
        _ = twinkle.NoSuchName


@pytest.mark.parametrize("module", MODULES)
def test_submodules_re_export_the_same_objects(module: str) -> None:
    public = importlib.import_module(f"twinkle.{module}")
    core = importlib.import_module(f"twinkle_core.{module}")
    assert public.__all__, module
    for name in public.__all__:
        assert getattr(public, name) is getattr(core, name), f"twinkle.{module}.{name}"
    core_all = getattr(core, "__all__", None)
    if core_all is not None:  # whatever twinkle_core publishes, twinkle publishes too
        assert set(core_all) <= set(public.__all__), (
            f"twinkle.{module} misses {set(core_all) - set(public.__all__)}"
        )


def test_the_seed_imports_work_and_name_one_class() -> None:
    from twinkle import DeviceMesh
    from twinkle.dataloader import DataLoader
    from twinkle.model import TransformersModel
    from twinkle_core.dataloader import DataLoader as CoreDataLoader
    from twinkle_core.mesh import DeviceMesh as CoreMesh
    from twinkle_core.model.transformers_model import TransformersModel as CoreModel

    assert (TransformersModel, DeviceMesh, DataLoader) == (CoreModel, CoreMesh, CoreDataLoader)


def test_importing_twinkle_stays_light() -> None:
    # Like twinkle_core, the package itself loads torch only when a heavy name is used.
    code = "import sys, twinkle, twinkle.dataset; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
