"""The fix to NNI 3.0's manager that ties each parameter set to the trial it was generated for.

The bug (upstream microsoft/nni issues 5689, 5693, 5726): the v3 compatibility layer of NNI's node training
service (`nni_node/training_service/v3/compat.js`) puts every new parameter set in one FIFO queue and hands the
head of the queue to whichever trial process asks first. With several trials starting at once, trials run with
each other's parameters while NNI (its web UI and its tuner) records the ones it generated for them; a trial that
dies before asking shifts every later trial by one. TPE then crashes on a result for parameters it never handed
out, and the experiment stays RUNNING.

The fix: the compat layer picks the trial id itself (NNI's own 5-character ids), files the parameters under that
id before the trial process exists, and passes the id to `createTrial`, which both v3 training services (local
and remote) accept; a parameter request is answered only from that map. The edit is a list of exact text
replacements, so applying it is idempotent and a file that matches neither the original nor the patched text
(another NNI version) is refused rather than half-edited.

    python -m hpo.nni.patch            # apply (what `make setup` runs); prints what it did
    python -m hpo.nni.patch --check    # exit 1 unless the installed NNI is patched
    python -m hpo.nni.patch --revert   # NNI's own file again (the engine then refuses to run)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpo.errors import HpoError

MARKER = "/* hpo.nni.patch: parameters tied to trial ids */"

# (original, patched) pairs of compat.js text, applied in order.
_EDITS: tuple[tuple[str, str], ...] = (
    (
        'const factory_1 = require("./factory");\n',
        'const factory_1 = require("./factory");\n' + MARKER + '\nconst hpoUtils = require("common/utils");\n',
    ),
    (
        """            try {
                trialId = await this.v3.createTrial(form.envId, """,
        """            this.allocatedParameters.set(form.id, form.hyperParameters.value);
            try {
                trialId = await this.v3.createTrial(form.envId, """,
    ),
    (
        """        if (trialId === null) {
            this.parameters.push(form.hyperParameters.value);
        }
        else {
            this.allocatedParameters.set(trialId, form.hyperParameters.value);
        }
""",
        """        if (trialId === null) {
            this.allocatedParameters.delete(form.id);
        }
""",
    ),
    (
        """            submitTime = Date.now();
            try {
                trialId = await this.v3.createTrial(envId, this.config.trialCommand, 'trial_code', form.sequenceId);
            }
            catch (error) {
                logger.error('Exception when create trial', form, ':', error);
            }
""",
        """            submitTime = Date.now();
            const newId = hpoUtils.uniqueString(5);
            this.allocatedParameters.set(newId, form.hyperParameters.value);
            try {
                trialId = await this.v3.createTrial(envId, this.config.trialCommand, 'trial_code', form.sequenceId,
                    newId);
            }
            catch (error) {
                logger.error('Exception when create trial', form, ':', error);
            }
            if (trialId !== newId) {
                this.allocatedParameters.delete(newId);
                if (trialId !== null) {
                    this.allocatedParameters.set(trialId, form.hyperParameters.value);
                }
            }
""",
    ),
    (
        """            else if (this.parameters.length > 0) {
                await this.v3.sendParameter(trialId, this.parameters.shift());
            }
            else {
                logger.error('No parameters available');
            }
""",
        """            else {
                logger.error('No parameters were generated for trial', trialId);
            }
""",
    ),
    (
        """        this.v3.onTrialEnd(async (trialId, timestamp, exitCode) => {
            const trial = this.trialJobs[trialId];
""",
        """        this.v3.onTrialEnd(async (trialId, timestamp, exitCode) => {
            this.allocatedParameters.delete(trialId);
            const trial = this.trialJobs[trialId];
""",
    ),
    # A trial stopped by the assessor ends while stopTrial is awaited, before the flag was set, so NNI showed
    # it as USER_CANCELED instead of EARLY_STOPPED: set the flag first.
    (
        """    async cancelTrialJob(trialJobId, isEarlyStopped) {
        try {
            await this.v3.stopTrial(trialJobId);
        }
        catch (error) {
            logger.error('Exception when cancel trial', trialJobId, ':', error);
        }
        this.trialJobs[trialJobId].isEarlyStopped = Boolean(isEarlyStopped);
""",
        """    async cancelTrialJob(trialJobId, isEarlyStopped) {
        this.trialJobs[trialJobId].isEarlyStopped = Boolean(isEarlyStopped);
        try {
            await this.v3.stopTrial(trialJobId);
        }
        catch (error) {
            logger.error('Exception when cancel trial', trialJobId, ':', error);
        }
""",
    ),
)


class NniPatchError(HpoError):
    """NNI is missing, or its manager is not the version this fix was written for."""


def compat_js() -> Path:
    """The installed `nni_node/training_service/v3/compat.js`."""
    try:
        import nni_node
    except ImportError:
        raise NniPatchError(
            "NNI is not installed: `pip install nni==3.0`, then `python -m hpo.nni.patch` (in a checkout, "
            "`make setup` does both)"
        ) from None
    return Path(nni_node.__file__).parent / "training_service" / "v3" / "compat.js"


def patch_text(text: str) -> str:
    """`text` with every edit applied; edits already there are kept (so text that is already patched comes back
    unchanged, and a file patched by an older version of this module gets the newer edits)."""
    for old, new in _EDITS:
        if new in text:
            continue
        if text.count(old) != 1:
            raise NniPatchError(f"compat.js does not contain the expected NNI 3.0 code:\n{old}reinstall nni==3.0")
        text = text.replace(old, new)
    return text


def unpatch_text(text: str) -> str:
    """The original NNI text of a patched `text` (the edits undone in reverse order)."""
    for old, new in reversed(_EDITS):
        if text.count(new) != 1:
            raise NniPatchError("compat.js is not patched by hpo.nni.patch")
        text = text.replace(new, old)
    return text


def is_patched(path: Path | None = None) -> bool:
    """Whether the installed NNI manager has every edit of the fix."""
    text = (path or compat_js()).read_text()
    return all(new in text for _, new in _EDITS)


def apply(path: Path | None = None) -> bool:
    """Patch the installed NNI manager; returns whether the file changed (False: it was already patched)."""
    path = path or compat_js()
    text = path.read_text()
    patched = patch_text(text)
    if patched == text:
        return False
    _replace(path, patched)
    return True


def revert(path: Path | None = None) -> bool:
    """NNI's own text back in the installed manager; returns whether the file changed (False: it was not patched)."""
    path = path or compat_js()
    text = path.read_text()
    if not any(new in text for _, new in _EDITS):
        return False
    _replace(path, unpatch_text(text))
    return True


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".hpo-tmp")
    tmp.write_text(text)
    tmp.replace(path)


def require_patched() -> None:
    """Raise, saying what to run, unless the installed NNI manager has the fix."""
    if not is_patched():
        raise NniPatchError(
            f"the installed NNI manager ({compat_js()}) lacks the fix that ties parameters to trials; "
            "run `make setup` or `python -m hpo.nni.patch`"
        )


WHAT = (
    f"NNI's manager ties each parameter set to the trial it was generated for ({len(_EDITS)} edits of its v3 "
    "compatibility layer; NNI issues 5689, 5693 and 5726: trials ran with each other's parameters)"
)


def main(argv: list[str] | None = None, path: Path | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpo.nni.patch", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="only check; exit 1 when the fix is missing")
    action.add_argument("--revert", action="store_true", help="put NNI's own file back (the nni engine then refuses)")
    args = parser.parse_args(argv)
    try:
        path = path or compat_js()
        if args.check:
            ok = is_patched(path)
            print(f"{path}: {'patched' if ok else 'NOT patched (run python -m hpo.nni.patch)'}")
            return 0 if ok else 1
        if args.revert:
            if revert(path):
                print(f"{path}: NNI's own text again; `python -m hpo.nni.patch` applies the fix again")
            else:
                print(f"{path}: not patched: left as it is")
            return 0
        changed = apply(path)
    except NniPatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if changed:
        print(f"{path}: patched: {WHAT}; `python -m hpo.nni.patch --revert` puts NNI's own file back")
    else:
        print(f"{path}: already patched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
