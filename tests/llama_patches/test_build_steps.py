"""build_server's steps in order, with the compiler replaced by a recorder (no real build)."""

from __future__ import annotations

import json
from pathlib import Path

from llama_patches import build


def test_build_copies_patches_configures_builds_and_marks(tmp_path: Path, monkeypatch) -> None:
    pristine = tmp_path / "pristine"
    (pristine / "models").mkdir(parents=True)  # left out of the copy
    (pristine / "CMakeLists.txt").write_text("project(x)\n")
    monkeypatch.setenv("VLEMBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CMAKE_ARGS", raising=False)
    monkeypatch.setattr(build, "pristine_source", lambda: pristine)
    monkeypatch.setattr(build, "_find_tools", lambda cuda: {"cmake": "cmake", "apply": "git"})
    applied: list[Path] = []
    monkeypatch.setattr(build, "_apply_series", lambda tree, tool: applied.append(tree))
    commands: list[list[str]] = []

    def run(cmd: list[str], cwd: Path | None = None) -> None:
        commands.append(cmd)
        if "--build" in cmd:  # what a real build leaves behind
            bin_dir = Path(cmd[cmd.index("--build") + 1]) / "bin"
            bin_dir.mkdir(parents=True, exist_ok=True)
            for target in build.TARGETS:
                (bin_dir / target).write_text("")

    monkeypatch.setattr(build, "_run_streamed", run)
    bin_dir = build.build_server(jobs=3)
    base = bin_dir.parent.parent
    assert applied == [base / "src"] and (base / "src" / "CMakeLists.txt").is_file()
    assert not (base / "src" / "models").exists()
    configure, compile_ = commands
    assert configure[:5] == ["cmake", "-S", str(base / "src"), "-B", str(base / "build")]
    assert compile_[compile_.index("-j") + 1] == "3"
    assert compile_[-len(build.TARGETS) :] == list(build.TARGETS)
    marker = json.loads((base / "BUILD_OK.json").read_text())
    assert marker["patch_hash"] == build.patch_hash() and marker["cmake_args"] == configure[5:]
    assert build.build_server(jobs=3) == bin_dir and len(commands) == 2  # cached: no rebuild
