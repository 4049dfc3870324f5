"""hpo.files.write_whole: a file written whole or not at all, checked where writing really fails part-way: a
process whose file-size limit (RLIMIT_FSIZE) is below the file's size, as a full disk stops a writer."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LIMIT = 4096  # bytes a process may write into one file


def write_limited(path: Path, size: int, replace: bool = True) -> subprocess.CompletedProcess:
    """write_whole(path, `size` bytes) in a process that cannot write more than LIMIT bytes into a file."""
    code = textwrap.dedent(f"""
        import resource, signal, sys
        from pathlib import Path
        from hpo.files import write_whole
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: an error (EFBIG), not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))
        try:
            write_whole(Path({str(path)!r}), b"x" * {size}, replace={replace})
        except OSError as e:
            sys.exit(f"OSError {{e.errno}}")
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("replace", [True, False])
def test_a_write_cut_short_leaves_no_file_and_an_earlier_one_whole(tmp_path, replace):
    out = tmp_path / "report.html"
    done = write_limited(out, LIMIT // 2, replace)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == b"x" * (LIMIT // 2)
    if replace:  # an earlier file stays whole while the larger one fails
        cut = write_limited(out, 3 * LIMIT)
        assert cut.returncode == 1 and cut.stderr.startswith("OSError 27"), cut.stderr  # EFBIG
        assert out.read_bytes() == b"x" * (LIMIT // 2)
    new = tmp_path / "table.jsonl"
    cut = write_limited(new, 3 * LIMIT, replace)
    assert cut.returncode == 1 and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]  # no hidden file left


def test_without_replace_an_existing_file_is_kept(tmp_path):
    from hpo.files import write_whole

    taken = tmp_path / "t.jsonl"
    taken.write_text("mine\n")
    with pytest.raises(FileExistsError):
        write_whole(taken, "new\n", replace=False)
    assert taken.read_text() == "mine\n" and [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]


def test_a_link_is_written_through_and_a_device_in_place(tmp_path):
    from hpo.files import write_whole

    target = tmp_path / "real.yaml"
    target.write_text("old\n")
    (tmp_path / "link.yaml").symlink_to(target)
    write_whole(tmp_path / "link.yaml", "new\n")
    assert (tmp_path / "link.yaml").is_symlink() and target.read_text() == "new\n"
    (tmp_path / "broken.yaml").symlink_to(tmp_path / "not-yet.yaml")  # a link to a file not there makes the file
    write_whole(tmp_path / "broken.yaml", "made\n")
    assert (tmp_path / "broken.yaml").is_symlink() and (tmp_path / "not-yet.yaml").read_text() == "made\n"
    write_whole(Path("/dev/null"), "nothing\n")  # not replaced by a file
    assert Path("/dev/null").is_char_device()


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc (Linux)")
def test_a_link_to_a_pipe_is_written_in_place(tmp_path):
    """/dev/stdout into a pipe (`hpo export -o /dev/stdout | ...`): the link names the pipe by a name that is no file
    (/proc/PID/fd/pipe:[N]); it was written beside that name, and failed."""
    from hpo.files import write_whole

    read_end, write_end = os.pipe()
    try:
        write_whole(Path(f"/proc/self/fd/{write_end}"), "through the pipe\n")
        os.close(write_end)
        assert os.read(read_end, 100) == b"through the pipe\n"
    finally:
        os.close(read_end)
        with contextlib.suppress(OSError):
            os.close(write_end)
