"""``vlembed eval ...`` end to end, through the top-level console script's dispatcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mteb", reason="needs the eval extra (mteb)")
pytest.importorskip("matplotlib", reason="needs the eval extra (matplotlib)")

from vlembed.cli import main as vlembed  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def warm_reference(monkeypatch: pytest.MonkeyPatch, tiny_backend) -> None:
    """Answer ``reference:…`` specs with the session's warm reference backend.

    Loading the checkpoint again costs seconds per test; ``test_local_command_prints_scores``
    keeps the real path, the other command tests only need a model behind the spec.
    """
    import eval.backends

    real = eval.backends.open_backend

    def open_backend(spec, **options):
        spec = eval.backends.parse_spec(spec) if isinstance(spec, str) else spec
        return tiny_backend if spec.kind == "reference" else real(spec, **options)

    monkeypatch.setattr(eval.backends, "open_backend", open_backend)


@pytest.fixture(scope="module")
def mini_docs(tmp_path_factory: pytest.TempPathFactory):
    """Four very small pages: the commands are under test here, not the model."""
    from eval.make_docs import make_docs

    return make_docs(tmp_path_factory.mktemp("mini") / "docs", 4, seed=2, scale=0.1)


def test_make_docs_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "docs"
    assert (
        vlembed(
            [
                "eval",
                "make-docs",
                "--out",
                str(out),
                "--n-pages",
                "4",
                "--seed",
                "1",
                "--scale",
                "0.1",
            ]
        )
        == 0
    )
    assert "wrote 4 pages" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_pages"] == 4 and manifest["seed"] == 1


def test_local_command_prints_scores(
    tiny_checkpoint: Path, mini_docs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = vlembed(
        [
            "eval",
            "local",
            "--docs",
            str(mini_docs.root),
            "--model",
            f"ref=reference:{tiny_checkpoint}",
            "--multivector",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("ref: nDCG@5 ") and "recall@5" in line
    scores = json.loads((tmp_path / "local_scores.json").read_text())
    assert set(scores["ref"]["VlembedLocalDocsRetrieval"]) >= {"ndcg_at_5", "recall_at_5"}
    assert (tmp_path / "results" / "vlembed__ref").is_dir()


def test_local_command_one_column_per_storage_option(
    tiny_backend,
    mini_docs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    warm_reference: None,
) -> None:
    """Each page is embedded once, whatever the number of storage options."""
    import eval.backends

    embedded: list[int] = []
    real_embed = type(tiny_backend).embed

    def counting_embed(self, items, **kw):
        if kw["task"] == "retrieval.passage":
            embedded.append(len(items))
        return real_embed(self, items, **kw)

    monkeypatch.setattr(eval.backends.ReferenceBackend, "embed", counting_embed)
    status = vlembed(
        [
            "eval",
            "local",
            "--docs",
            str(mini_docs.root),
            "--model",
            "reference",
            "--multivector",
            "--storage",
            "float32",
            "--storage",
            "pool2+binary",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    lines = capsys.readouterr().out.strip().splitlines()
    columns = ["reference float32", "reference pool2+binary"]
    assert [ln.split(":")[0] for ln in lines[-2:]] == columns
    assert sum(embedded) == len(mini_docs.corpus)
    assert set(json.loads((tmp_path / "local_scores.json").read_text())) == set(columns)


def test_bad_storage_spec_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        vlembed(["eval", "local", "--docs", "D", "--model", "reference", "--storage", "int8"])
    assert exc.value.code == 2
    assert "unknown storage option 'int8'" in capsys.readouterr().err


def test_parity_command(
    tiny_checkpoint: Path,
    mini_docs,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    warm_reference: None,
) -> None:
    models = f"reference:{tiny_checkpoint},same=reference:{tiny_checkpoint}"
    status = vlembed(
        [
            "eval",
            "parity",
            "--models",
            models,
            "--docs",
            str(mini_docs.root),
            "--out",
            str(tmp_path),
            "--heatmaps",
            "1",
            "--single-only",
        ]
    )
    assert status == 0
    assert "| single-vector cosine, pages (min / mean) | 1.000000 / 1.000000 |" in (
        capsys.readouterr().out
    )
    assert (tmp_path / "parity.json").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["local", "--docs", "DOCS", "--model", "ftp://x"], "unknown model spec 'ftp://x'"),
        (["parity", "--models", "reference", "--docs", "NOWHERE", "--out", "OUT"], "make-docs"),
        (["vidore", "--benchmark", "ViDoRe(v1)"], "give --model"),
        (
            ["local", "--docs", "DOCS", "--model", "reference", "--storage", "pool2"],
            "--storage applies to multi-vectors",
        ),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    argv: list[str], message: str, small_docs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        {"DOCS": str(small_docs.root), "NOWHERE": str(tmp_path / "none"), "OUT": str(tmp_path)}.get(
            a, a
        )
        for a in argv
    ]
    assert vlembed(["eval", *argv]) == 2
    assert message in capsys.readouterr().err


def test_vidore_offline_names_the_missing_dataset(tmp_path: Path) -> None:
    """Empty HF cache + --offline: a message naming the dataset and the fix, no traceback.

    Runs in a subprocess because the hub libraries read their cache location at import time.
    """
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(REPO)}
    env.pop("HF_HUB_OFFLINE", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlembed.cli",
            "eval",
            "vidore",
            "--tasks",
            "VidoreArxivQARetrieval",
            "--model",
            "http://127.0.0.1:9",
            "--offline",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "mteb/arxivqa_test_subsampled_beir" in proc.stderr
    assert "--tasks VidoreArxivQARetrieval --download" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_vidore_command_on_stand_in_data(
    tiny_checkpoint: Path,
    mini_docs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    warm_reference: None,
) -> None:
    """MTEB's real ViDoRe task classes, with their hub loader swapped for a local set."""
    from datasets import Dataset
    from datasets import Image as ImageFeature
    from mteb.tasks.retrieval.eng import vidore_bench_retrieval

    def load_local(path: str, splits: list[str], revision: str | None = None):
        corpus = Dataset.from_dict(
            {
                "id": [f"corpus-test-{d.id}" for d in mini_docs.corpus],
                "image": [str(mini_docs.image_path(d)) for d in mini_docs.corpus],
                "modality": ["image"] * len(mini_docs.corpus),
            }
        ).cast_column("image", ImageFeature())
        queries = Dataset.from_dict(
            {
                "id": [f"query-test-{q.id}" for q in mini_docs.queries],
                "text": [q.text for q in mini_docs.queries],
                "modality": ["text"] * len(mini_docs.queries),
            }
        )
        qrels = {
            f"query-test-{q}": {f"corpus-test-{d}": s for d, s in rels.items()}
            for q, rels in mini_docs.qrels.items()
        }
        return {"test": corpus}, {"test": queries}, {"test": qrels}

    monkeypatch.setattr(vidore_bench_retrieval, "_load_data", load_local)
    tasks = ["VidoreArxivQARetrieval", "VidoreTabfquadRetrieval"]
    status = vlembed(
        [
            "eval",
            "vidore",
            "--tasks",
            *tasks,
            "--model",
            f"reference:{tiny_checkpoint}",
            "--model",
            f"again=reference:{tiny_checkpoint}",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    table = (tmp_path / "vidore_table.md").read_text()
    assert table.splitlines()[0] == "| Task | reference | again |"
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == [
        "| VidoreArxivQARetrieval",
        "| VidoreTabfquadRetrieval",
        "| Mean",
    ]
    assert table in capsys.readouterr().out
    scores = json.loads((tmp_path / "vidore_scores.json").read_text())
    assert scores["reference"] == scores["again"]
