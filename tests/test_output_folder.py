"""First contact with `convert`'s output folder and exits: earlier outputs are refused unless
--overwrite (which replaces only ours), a failed run leaves nothing, an unwritable folder is one
line, duplicate ranks are refused before any work, a file named twice is one file, Ctrl-C is
exit 130, and SIGTERM is exit 143 with nothing left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from chakra_hooks.convert import convert_paths
from chakra_hooks.common.errors import TraceFormatError


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chakra_hooks", *args], capture_output=True,
                          text=True, timeout=300)


def _errors(result: subprocess.CompletedProcess) -> list[str]:
    """The error lines (warnings, e.g. about ranks of the corpus's run left out, may precede)."""
    return [line for line in result.stderr.splitlines() if line.startswith("chakra-hooks: error")]


def test_earlier_outputs_are_refused_then_replaced_with_overwrite(corpus, dlrm_two_ranks,
                                                                  tmp_path):
    out = tmp_path / "out"
    convert_paths([corpus / "pytorch" / "v100_dlrm_8rank"], out, progress=False)  # 8 ranks
    (out / "notes.txt").write_text("mine")
    refused = _cli("convert", str(dlrm_two_ranks), "-o", str(out))
    assert refused.returncode == 1 and "--overwrite" in refused.stderr
    assert _errors(refused) == [line for line in refused.stderr.splitlines() if "--overwrite" in line]
    assert len(list(out.glob("*.et"))) == 8  # untouched
    done = _cli("convert", str(dlrm_two_ranks), "-o", str(out), "--overwrite")
    assert done.returncode == 0, done.stderr
    # Ranks 2-7 of the earlier run are gone (never mixed in); the user's file stays.
    assert sorted(p.name for p in out.glob("*.et")) == ["chakra.0.et", "chakra.1.et"]
    assert (out / "notes.txt").read_text() == "mine"
    assert _cli("validate", "--target", "full", str(out)).returncode == 0


def test_failed_convert_leaves_no_folder(dlrm_two_ranks, tmp_path):
    broken = dlrm_two_ranks / next(dlrm_two_ranks.glob("worker1_*")).name
    broken.write_bytes(broken.read_bytes()[:20000])
    out = tmp_path / "never"
    assert _cli("convert", str(dlrm_two_ranks), "-o", str(out)).returncode == 1
    assert not out.exists()


def test_unwritable_output_folder_is_one_line(dlrm_two_ranks, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = _cli("convert", str(dlrm_two_ranks), "-o", str(blocker / "out"))
    assert result.returncode == 1
    (error,) = _errors(result)
    assert "output folder" in error and str(blocker) in error
    assert "Traceback" not in result.stderr


def test_duplicate_ranks_refused_before_any_work(corpus, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(corpus / "pytorch" / "a100_resnet_nccl", copy)
    with pytest.raises(TraceFormatError, match="rank 0") as err:
        convert_paths([corpus / "pytorch" / "a100_resnet_nccl", copy], tmp_path / "out",
                      progress=False)
    assert "one set of traces per rank" in str(err.value)
    assert not (tmp_path / "out").exists()  # refused before converting anything


def test_a_file_named_twice_is_one_trace(corpus, tmp_path):
    trace = corpus / "kineto_only" / "b200_eager_rank0.json.gz"
    result = convert_paths([trace, trace, trace.parent / "." / trace.name], tmp_path / "out",
                           progress=False)
    assert [r.rank for r in result.ranks] == [0]


def test_ctrl_c_exits_130(dlrm_two_ranks, tmp_path):
    """A real SIGINT while convert runs (sent once discovery has started, so it lands inside the
    command, not in Python's start-up)."""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        import chakra_hooks.convert as conv
        from chakra_hooks.cli import main

        # Python's own SIGINT handler, which a shell's background job (nohup ... &, some CI
        # runners) starts without: the disposition this test relies on, set by the test.
        signal.signal(signal.SIGINT, signal.default_int_handler)

        real = conv.discover
        def discover(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
            return real(*args, **kwargs)
        conv.discover = discover
        sys.argv = ["chakra-hooks", "convert", {str(dlrm_two_ranks)!r}, "-o",
                    {str(tmp_path / "out")!r}]
        main()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 130, result.stderr
    assert "interrupted" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("folder_existed", [False, True])
def test_sigterm_exits_143_and_leaves_nothing_behind(dlrm_two_ranks, tmp_path, folder_existed):
    """A real SIGTERM (a scheduler's time limit) once a rank's ET is staged in the output
    folder: Python's default ended the process there and left the staging folder, partial
    ETs inside, and the output folder it had made."""
    out = tmp_path / "out"
    if folder_existed:
        out.mkdir()
        (out / "notes.txt").write_text("the user's")
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        import chakra_hooks.convert as conv
        from chakra_hooks.cli import main

        real = conv.convert_job
        def convert_job(*args, **kwargs):
            done = real(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            return done
        conv.convert_job = convert_job
        sys.argv = ["chakra-hooks", "convert", {str(dlrm_two_ranks)!r}, "-o", {str(out)!r},
                    "-j", "1"]
        main()
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 143, result.stderr
    assert "terminated" in result.stderr and "Traceback" not in result.stderr
    if folder_existed:
        assert [p.name for p in out.iterdir()] == ["notes.txt"]
    else:
        assert not out.exists()


def test_overwrite_replaces_only_the_prefix_being_written(dlrm_two_ranks, tmp_path):
    out = tmp_path / "out"
    convert_paths([dlrm_two_ranks], out, progress=False)
    kept = sorted(p.name for p in out.glob("chakra.*.et"))
    convert_paths([dlrm_two_ranks], out, prefix="foo", progress=False, overwrite=True)
    assert sorted(p.name for p in out.glob("chakra.*.et")) == kept
    assert sorted(p.name for p in out.glob("foo.*.et")) == [k.replace("chakra", "foo") for k in kept]


def test_two_converts_into_one_folder_exactly_one_succeeds(corpus, dlrm_two_ranks, tmp_path):
    """Started 0.3 s apart, both used to exit 0, the later silently replacing the other's ETs;
    the output folder is now claimed (a lock holding the convert's pid), and the earlier-output
    check runs again once it is."""
    import time

    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "chakra_hooks", "convert", str(dlrm_two_ranks), "-o", str(out)]
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)
    second = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    codes = sorted(p.wait(timeout=300) for p in (first, second))
    assert codes == [0, 1]
    said = first.stderr.read() + second.stderr.read()
    assert "another convert" in said or "holds an earlier conversion" in said
    assert not list(out.glob(".chakra-hooks*"))  # no lock, no staging left


def test_a_killed_converts_staging_is_removed_by_the_next(corpus, dlrm_two_ranks, tmp_path):
    """A convert killed with SIGKILL leaves its lock and its staging folder (sometimes with a
    partial ET); the next convert into the folder takes the lock over and removes the staging,
    saying so."""
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    import socket

    (out / ".chakra-hooks.lock").write_text(f"{dead}@{socket.gethostname()}")
    left = out / ".chakra-hooks-abc123"
    left.mkdir()
    (left / "chakra.0.et.tmp").write_bytes(b"partial")
    done = _cli("convert", str(dlrm_two_ranks), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"{left}: removed, the staging folder of a convert that did not finish" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["chakra.0.et", "chakra.1.et"]
