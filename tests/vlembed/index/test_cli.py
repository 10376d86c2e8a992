"""``vlembed index`` flags that are refused before anything is started."""

from __future__ import annotations

import pytest

from vlembed.index.cli import _ray_address, index_main


@pytest.mark.parametrize(
    ("value", "want"),
    [("", None), ("auto", "auto"), ("ray://head:10001", "ray://head:10001"),
     ("10.0.0.5:6379", "10.0.0.5:6379"), ("local", "local")],
)  # fmt: skip
def test_ray_address_accepts_what_ray_init_takes(value: str, want: str | None) -> None:
    assert _ray_address(value) == want


@pytest.mark.parametrize("value", ["docs/", "report.pdf", "./scans"])
def test_a_path_swallowed_by_ray_is_refused_with_a_hint(value: str) -> None:
    with pytest.raises(ValueError, match="put --ray after the paths"):
        _ray_address(value)


def test_ray_before_a_path_exits_2(tmp_path, capsys) -> None:
    status = index_main(["--ray", str(tmp_path), str(tmp_path), "--server", "http://127.0.0.1:9"])
    assert status == 2
    assert "put --ray after the paths" in capsys.readouterr().err


def test_several_servers_need_ray(tmp_path, capsys) -> None:
    argv = [str(tmp_path), "--index", str(tmp_path / "idx"), "--server", "http://a:1",
            "--server", "http://b:2"]  # fmt: skip
    assert index_main(argv) == 2
    assert "several --server need --ray" in capsys.readouterr().err
