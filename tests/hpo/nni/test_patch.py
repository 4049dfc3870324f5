"""The fix to NNI 3.0's manager (`hpo.nni.patch`): applied by the project's set-up, idempotent, and refusing a
manager it was not written for. That the fix works is shown by the engine tests (tests/hpo/nni/test_engine.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpo.nni.patch import MARKER, NniPatchError, apply, compat_js, is_patched, patch_text, unpatch_text


def test_the_installed_nni_manager_is_patched_by_the_setup():
    # `make setup` runs `python -m hpo.nni.patch` after installing nni==3.0.
    assert is_patched(), "run `make setup` (or python -m hpo.nni.patch)"
    check = subprocess.run([sys.executable, "-m", "hpo.nni.patch", "--check"], capture_output=True, text=True)
    assert check.returncode == 0 and "patched" in check.stdout


def test_patching_is_idempotent_and_reversible():
    installed = compat_js().read_text()
    original = unpatch_text(installed)
    assert MARKER not in original and "this.parameters.push(form.hyperParameters.value)" in original
    assert patch_text(original) == installed  # the setup's result is exactly the edit list applied once
    assert patch_text(installed) == installed  # applying again changes nothing
    assert "this.parameters.shift()" not in installed  # no parameters handed out in queue order any more


def test_apply_edits_the_file_once(tmp_path):
    path = tmp_path / "compat.js"
    path.write_text(unpatch_text(compat_js().read_text()))
    assert not is_patched(path)
    assert apply(path) is True
    assert is_patched(path) and path.read_text() == compat_js().read_text()
    assert apply(path) is False  # the second run of the setup leaves it alone


def test_a_manager_of_another_version_is_refused_untouched(tmp_path):
    path = tmp_path / "compat.js"
    other = unpatch_text(compat_js().read_text()).replace("this.parameters.shift()", "this.queue.pop()")
    path.write_text(other)
    with pytest.raises(NniPatchError, match="reinstall nni==3.0"):
        apply(path)
    assert path.read_text() == other


def test_the_command_says_what_it_fixed_and_reverts_to_nnis_own_file(tmp_path, capsys):
    """It printed only "patched", and NNI's own file came back only by reinstalling nni."""
    from hpo.nni.patch import main

    path = tmp_path / "compat.js"
    original = unpatch_text(compat_js().read_text())
    path.write_text(original)
    assert main([], path=path) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"{path}: patched: NNI's manager ties each parameter set to the trial it was generated for")
    assert "NNI issues 5689, 5693 and 5726" in said and "`python -m hpo.nni.patch --revert`" in said
    assert main(["--revert"], path=path) == 0 and path.read_text() == original
    assert capsys.readouterr().out == f"{path}: NNI's own text again; `python -m hpo.nni.patch` applies the fix again\n"
    assert main(["--revert"], path=path) == 0 and path.read_text() == original
    assert capsys.readouterr().out == f"{path}: not patched: left as it is\n"
    assert main(["--check"], path=path) == 1
