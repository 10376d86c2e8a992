"""The build's subprocess output reaches ``sys.stderr`` whether or not it has a file descriptor.

Under pytest's ``capsys`` or in a Jupyter kernel ``sys.stderr.fileno()`` raises; handing such an
object to ``subprocess`` failed the first build on a fresh machine with "error: fileno".
"""

from __future__ import annotations

import io
import sys

import pytest

from llama_patches import build

CHILD = (
    "import sys; print('to stdout'); sys.stdout.flush(); "
    "print('to stderr', file=sys.stderr); sys.exit({code})"
)


def _cmd(code: int = 0) -> list[str]:
    return [sys.executable, "-c", CHILD.format(code=code)]


def test_output_is_forwarded_to_a_stderr_without_fileno(monkeypatch) -> None:
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stderr", fake)
    assert build._stderr_fd() is None
    assert build._run_to_stderr(_cmd()) == 0
    assert fake.getvalue().splitlines() == ["to stdout", "to stderr"]


def test_exit_code_and_build_error_without_fileno(monkeypatch) -> None:
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stderr", fake)
    assert build._run_to_stderr(_cmd(3)) == 3
    with pytest.raises(build.BuildError, match="exit code 3"):
        build._run_streamed(_cmd(3))
    assert "to stdout" in fake.getvalue() and "to stderr" in fake.getvalue()


def test_no_stderr_at_all(monkeypatch) -> None:
    monkeypatch.setattr(sys, "stderr", None)
    assert build._run_to_stderr(_cmd()) == 0


def test_output_goes_to_the_real_stderr_fd(capfd) -> None:
    """With a real descriptor the child writes to it directly (output as it happens)."""
    assert build._stderr_fd() is not None
    build._run_streamed(_cmd())
    captured = capfd.readouterr()
    assert "to stdout" in captured.err and "to stderr" in captured.err
    assert "to stdout" not in captured.out


def test_non_utf8_output_does_not_fail(monkeypatch) -> None:
    fake = io.StringIO()
    monkeypatch.setattr(sys, "stderr", fake)
    cmd = [sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'caf\\xe9\\n')"]
    assert build._run_to_stderr(cmd) == 0
    assert fake.getvalue().startswith("caf")


def test_under_capsys(capsys) -> None:
    """The case seen in the suite: a CLI test with ``capsys`` that triggers the first build."""
    build._run_streamed(_cmd())
    err = capsys.readouterr().err
    assert "to stdout" in err and "to stderr" in err
