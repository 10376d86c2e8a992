"""docs/BENCHMARKS.md (tables + chart) from the JSON ``vlembed bench`` writes."""

from __future__ import annotations

from pathlib import Path


def _fmt(s: dict, scale: float = 1.0, digits: int = 2) -> str:
    return (
        f"{s['median'] * scale:.{digits}f} "
        f"({s['min'] * scale:.{digits}f}–{s['max'] * scale:.{digits}f})"
    )


def _chart(results: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    ref = results.get("reference", {}).get("hf-f32")
    rows = []
    n_text = ref["text_tokens"] if ref else 443
    engines = list(results.get("reference", {}).items()) + list(results.get("vlembed", {}).items())
    for name, r in engines:
        rows.append(
            (
                name,
                1 / r["image_s"]["median"],
                1 / r["page_s"]["median"] if "page_s" in r else 0.0,
                r.get("text_tokens", n_text) / r["text_s"]["median"],
            )
        )
    if not rows:
        return False
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    names = [r[0] for r in rows]
    colors = ["#888888" if n.startswith("hf") else "#1f77b4" for n in names]
    panels = (
        (axes[0], 1, f"images / s ({results['image']})"),
        (axes[1], 2, "pages / s (1275x1650)"),
        (axes[2], 3, "text tokens / s"),
    )
    for ax, idx, title in panels:
        ax.barh(names, [r[idx] for r in rows], color=colors)
        ax.set_title(title)
        ax.invert_yaxis()
        if ref:
            base = rows[0][idx]
            ax.axvline(base, color="black", lw=0.8, ls="--")
    fig.suptitle(
        f"{results['preset']} preset, {results['machine']['threads']} threads — "
        "grey: PyTorch reference, blue: vlembed end to end"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _batch_images(run: dict) -> str:
    """The images of a batching run; runs recorded before mixed sizes name one square size."""
    return run["images"] if "images" in run else f"{run['size']}x{run['size']}"


def write_report(results: dict, out: Path) -> None:
    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        "Regenerate with `vlembed bench` (writes docs/benchmarks.json and this file). All numbers",
        "come from one run on one machine; medians with (min–max) over the repeats.",
        "",
        f"- machine: {m['processor']}, {m['cpu_count']} cores, {m['threads']} threads used",
        f"- model: `{results['preset']}` synthetic preset (random weights), "
        f"image {results['image']}, date {results['date']}",
        "",
    ]
    ref = results.get("reference", {})
    base_img = ref.get("hf-f32", {}).get("image_s", {}).get("median")
    base_txt = ref.get("hf-f32", {}).get("text_s", {}).get("median")
    n_text = ref.get("hf-f32", {}).get("text_tokens")
    lines += [
        "## End to end: images and text",
        "",
        "| engine | image s/img | images/s | × HF f32 | text s/request | text tok/s | "
        "× HF f32 | service overhead (image / text) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in list(ref.items()) + list(results.get("vlembed", {}).items()):
        img_s, txt_s = r["image_s"]["median"], r["text_s"]["median"]
        ntok = r.get("text_tokens", n_text) or 0
        x_img = f"{base_img / img_s:.2f}" if base_img else "–"
        x_txt = f"{base_txt / txt_s:.2f}" if base_txt else "–"
        over = "–"
        if "image_overhead" in r:
            over = (
                f"{r['image_overhead']['median'] * 100:.1f} % / "
                f"{r['text_overhead']['median'] * 100:.1f} %"
            )
        lines.append(
            f"| {name} | {_fmt(r['image_s'])} | {1 / img_s:.2f} | {x_img} | "
            f"{_fmt(r['text_s'])} | {ntok / txt_s:.0f} | {x_txt} | {over} |"
        )
    base_page = ref.get("hf-f32", {}).get("page_s", {}).get("median")
    engines = list(ref.items()) + list(results.get("vlembed", {}).items())
    if base_page and all("page_s" in r for _, r in engines):
        lines += [
            "",
            "## Document page (1275x1650, 2976 patches, 744 image tokens)",
            "",
            "| engine | s/page | pages/s | × HF f32 |",
            "|---|---|---|---|",
        ]
        for name, r in engines:
            page_s = r["page_s"]["median"]
            lines.append(
                f"| {name} | {_fmt(r['page_s'])} | {1 / page_s:.2f} | {base_page / page_s:.2f} |"
            )
    if _chart(results, out.parent / "benchmarks.png"):
        lines += ["", "![throughput](benchmarks.png)"]
    if "raw_path" in results:
        raw = results["raw_path"]
        lines += [
            "",
            "## Upstream raw-image path vs precomputed patches (llama-server, F32)",
            "",
            "| path | s/img |",
            "|---|---|",
            f"| upstream raw image (llama.cpp resize + conv2d) | {_fmt(raw['raw_image_s'])} |",
            f"| precomputed HF patches (vlembed) | {_fmt(raw['precomputed_s'])} |",
        ]
    if "preprocess" in results:
        lines += [
            "",
            "## Preprocessing alone vs `Qwen2VLImageProcessorPil`",
            "",
            "| image | vlembed ms | HF ms | speed-up |",
            "|---|---|---|---|",
        ]
        for name, r in results["preprocess"].items():
            lines.append(
                f"| {name} | {_fmt(r['vlembed_s'], 1000, 1)} | "
                f"{_fmt(r['hf_s'], 1000, 1)} | {r['speedup']:.2f}× |"
            )
    if "concurrency" in results:
        c = results["concurrency"]
        lines += [
            "",
            f"## Scaling with requests in flight ({c['variant']}, image requests, "
            "one image per vision forward)",
            "",
            "| in flight | images/s |",
            "|---|---|",
        ]
        for level, r in c["levels"].items():
            lines.append(f"| {level} | {r['images_per_s']:.2f} |")
    if "vision_batching" in results:
        vb = results["vision_batching"]
        lines += [
            "",
            f"## Batched vision encoding ({vb['variant']}, requests in flight = slots)",
            "",
            "The images of concurrent requests in one vision forward (patch 0006 for one size, "
            "0009 for mixed sizes; `--vision-batch-tokens` > 1) against one image per forward "
            "(`1`).",
            "",
            "| images | in flight | --vision-batch-tokens | images/s | "
            "llama-server peak RSS (MB) |",
            "|---|---|---|---|---|",
        ]
        for r in vb["runs"].values():
            lines.append(
                f"| {_batch_images(r)} | {r['in_flight']} | {r['vision_batch_tokens']} | "
                f"{_fmt(r['images_per_s'])} | {r['peak_rss_mb']:.0f} |"
            )
    if "patch_transport" in results:
        pt = results["patch_transport"]
        lines += [
            "",
            f"## Patch transport to llama-server ({pt['preset']} preset, {pt['variant']}, "
            f"page 1275x1650, {pt['patches']} patches, {pt['threads']} threads, {pt['date']})",
            "",
            "The same page through the service with `--patch-transport f32` (base64 float32 rows "
            "in JSON) and `auto` (VLP1: uint8 pixels + lookup table, patch 0007); rows are "
            f"bit-identical. Serve processes alternate, {pt['rounds']} rounds each.",
            "",
            "| --patch-transport | request body (bytes) | s/page | waiting on llama-server (s) |",
            "|---|---|---|---|",
        ]
        for name, r in pt["runs"].items():
            lines.append(
                f"| {name} | {r['wire_bytes']:,} | {_fmt(r['page_s'])} | {_fmt(r['backend_s'])} |"
            )
    if "quality" in results:
        lines += [
            "",
            "## Quantisation parity vs the f32 reference (bench preset, random weights)",
            "",
            "| variant | single-vector cos min (text / image) | mean | multi-vector row cos min |",
            "|---|---|---|---|",
        ]
        for name, q in results["quality"].items():
            lines.append(
                f"| {name} | {q['text_single_min']:.5f} / {q['image_single_min']:.5f} | "
                f"{q['single_mean']:.5f} | {q['multi_row_min']:.4f} |"
            )
    full = out.parent / "BENCHMARKS.full.md"  # `vlembed bench --preset full`, run on its own
    if full.is_file():
        lines += ["", full.read_text().strip()]
    notes = out.parent / "BENCHMARKS.notes.md"
    if notes.is_file():
        lines += ["", notes.read_text().strip()]
    out.write_text("\n".join(lines) + "\n")
