"""A realistic document-retrieval set made offline: rendered pages, queries, qrels.

ViDoRe needs the Hugging Face hub; this set needs nothing. Each page is drawn with Pillow (text,
tables, receipts) and matplotlib (charts) in one of four shapes that stress the image
preprocessing differently:

- ``report``: A4-like portrait page (827x1169 at scale 1): title, paragraphs, a table, a chart;
- ``slide``: 16:9 (1280x720): title band, bullet points, a chart or a big KPI number;
- ``receipt``: a long narrow till receipt (400 x 700-1400): monospaced item lines, a total;
- ``datasheet``: A4 landscape (1169x827): a specification table and a chart.

Every page is built around names no other page uses (a company, a project code name, a store, a
product model), and each query asks for a fact printed on its page next to such a name, so
exactly one page answers it. Everything comes from ``random.Random`` seeded per page from the
set's seed: the same seed gives the same files, and page i does not depend on how many pages
follow it. Fonts are the DejaVu faces bundled with matplotlib, so no system font is needed.
"""

from __future__ import annotations

import functools
import random
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from eval.docset import FORMAT, DocEntry, DocSet, QueryEntry, write_docset

__all__ = ["KINDS", "make_docs", "render_page"]

KINDS: tuple[str, ...] = ("report", "slide", "receipt", "datasheet")
BASE_SIZES: dict[str, tuple[int, int]] = {
    "report": (827, 1169),
    "slide": (1280, 720),
    "receipt": (400, 0),  # height follows the number of items
    "datasheet": (1169, 827),
}
MIN_SIDE = 56  # two merged patches: the smallest side the image preprocessing keeps

_SYLLABLES = (
    "vel mor an tri cor lum dex ora ven tal sol quin bra nex pol ar is ka ren zu mi tho gal fen"
).split()
_COMPANY_KINDS = (
    "Dynamics Holdings Logistics Biotech Analytics Energy Foods Materials Robotics Textiles "
    "Mining Aerospace"
).split()
_FIRST = (
    "Amara Bruno Chloe Dmitri Elena Farid Greta Hiro Ines Jonas Kaya Luca Mei Nadia Oscar "
    "Priya Quentin Rosa Sven Tariq Uma Viktor Wen Yara"
).split()
_LAST = (
    "Okafor Lindqvist Moreau Tanaka Castillo Novak Haddad Fischer Kowalski Mensah Ricci Sato "
    "Varga Nilsen Duarte Ibrahim"
).split()
_CITIES = (
    "Lisbon|Osaka|Nairobi|Calgary|Tallinn|Porto Alegre|Adelaide|Gdansk|Valparaiso|Tbilisi|"
    "Bergen|Da Nang|Leipzig|Cordoba|Tampere|Izmir"
).split("|")
_ADJ = "Amber Cobalt Silent Northern Crimson Velvet Granite Hollow Lunar Copper".split()
_ANIMALS = "Heron Lynx Falcon Otter Bison Kestrel Marlin Ibex Puffin Gecko".split()
_METRICS: tuple[tuple[str, str], ...] = (
    ("revenue", "M EUR"),
    ("net profit", "M EUR"),
    ("headcount", "employees"),
    ("energy use", "GWh"),
    ("R&D spend", "M EUR"),
    ("units shipped", "k units"),
    ("water use", "ML"),
)
_TOPICS = (
    "Annual Report|Sustainability Review|Quarterly Update|Market Outlook|Audit Summary|"
    "Operations Review"
).split("|")
_STORE_KINDS = "Market Bakery Hardware Pharmacy Books Deli Garden Outfitters".split()
_ITEMS: tuple[tuple[str, float], ...] = (
    ("espresso", 2.2),
    ("sourdough loaf", 4.8),
    ("notebook A5", 3.5),
    ("AA batteries x4", 5.9),
    ("olive oil 1l", 9.4),
    ("oat milk", 2.1),
    ("tomatoes 500g", 2.7),
    ("parmesan", 6.3),
    ("dish soap", 2.9),
    ("light bulb E27", 4.4),
    ("garden gloves", 7.8),
    ("paracetamol", 3.1),
    ("green tea", 4.0),
    ("dark chocolate", 2.6),
    ("rice 2kg", 5.2),
    ("wood screws", 3.8),
    ("sunscreen", 11.9),
    ("postcards x5", 4.5),
    ("bananas", 1.9),
    ("coffee beans", 12.5),
    ("masking tape", 2.4),
    ("apple juice", 2.3),
    ("pencil set", 6.7),
    ("yoghurt", 1.4),
)
_PRODUCTS: dict[str, tuple[str, ...]] = {
    "pump": ("rated power (kW)", "flow (m3/h)", "head (m)", "weight (kg)"),
    "inverter": ("rated power (kW)", "efficiency (%)", "input voltage (V)", "weight (kg)"),
    "compressor": ("free air delivery (l/s)", "pressure (bar)", "noise (dB)", "weight (kg)"),
    "sensor": ("range (m)", "accuracy (mm)", "sampling rate (Hz)", "power draw (W)"),
}
_NOUNS = (
    "supply chain|maintenance plan|pricing model|data platform|safety programme|"
    "procurement process|training budget|field network|logistics hub|customer portal"
).split("|")
_STATES = "stable|ahead of plan|under review|on budget|slightly delayed".split("|")
_VERBS = "improve|stabilise|expand|consolidate|recover".split("|")
_FILLER = (
    "The {noun} remained {state} throughout the period, and the board expects the {noun2} to "
    "{verb} during {year}.",
    "Teams in {city} focused on the {noun} and the {noun2}, completing {count} milestones.",
    "Compared with the previous review, costs of the {noun} rose by {pct}% while the {noun2} "
    "stayed within budget.",
    "An internal audit of the {noun} found {count} open issues, all scheduled to close before "
    "Q{q} {year}.",
    "Management will revisit the {noun} once the {noun2} has been rolled out in {city}.",
)


# --- names that no other page uses -------------------------------------------------------------


class _Registry:
    """Remembers every distinctive name handed out, so that no two pages share one."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def unique(self, rng: random.Random, make: Callable[[random.Random], str]) -> str:
        for _ in range(50):
            name = make(rng)
            if name not in self.used:
                self.used.add(name)
                return name
        n = 2
        while f"{name} {n}" in self.used:
            n += 1
        self.used.add(f"{name} {n}")
        return f"{name} {n}"


def _company(rng: random.Random) -> str:
    word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
    return f"{word} {rng.choice(_COMPANY_KINDS)}"


def _project(rng: random.Random) -> str:
    return f"{rng.choice(_ADJ)} {rng.choice(_ANIMALS)}"


def _store(rng: random.Random) -> str:
    word = "".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize()
    return f"{word} {rng.choice(_STORE_KINDS)}"


def _model_code(rng: random.Random) -> str:
    return f"{rng.choice('ABKMRTVXZ')}{rng.choice('ABKMRTVXZ')}-{rng.randint(1000, 9999)}"


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _filler(rng: random.Random, city: str, year: int, template: str | None = None) -> str:
    nouns = rng.sample(_NOUNS, 2)
    return (template or rng.choice(_FILLER)).format(
        noun=nouns[0],
        noun2=nouns[1],
        state=rng.choice(_STATES),
        verb=rng.choice(_VERBS),
        year=year,
        city=city,
        count=rng.randint(3, 19),
        pct=rng.randint(2, 28),
        q=rng.randint(1, 4),
    )


# --- drawing helpers --------------------------------------------------------------------------


@functools.cache
def _font(face: str, size: int) -> ImageFont.FreeTypeFont:
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / f"{face}.ttf"
    return ImageFont.truetype(str(path), max(6, size))


def _wrap(text: str, font: ImageFont.FreeTypeFont, width: float) -> list[str]:
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}".strip()
        if current and font.getlength(candidate) > width:
            lines.append(current)
            current = word
        else:
            current = candidate
    if current:
        lines.append(current)
    return lines


def _text_block(
    draw: ImageDraw.ImageDraw,
    xy: tuple[float, float],
    text: str,
    font: ImageFont.FreeTypeFont,
    width: float,
    fill: tuple[int, int, int] = (30, 30, 30),
) -> float:
    """Draw wrapped text; return the y below it."""
    x, y = xy
    step = font.size * 1.35
    for line in _wrap(text, font, width):
        draw.text((x, y), line, font=font, fill=fill)
        y += step
    return y


def _fill(
    draw: ImageDraw.ImageDraw,
    rng: random.Random,
    xy: tuple[float, float],
    bottom: float,
    font: ImageFont.FreeTypeFont,
    width: float,
    city: str,
    year: int,
) -> float:
    """Add filler paragraphs while whole paragraphs still fit above ``bottom``."""
    x, y = xy
    step = font.size * 1.35
    while True:
        templates = rng.sample(_FILLER, rng.randint(2, 4))
        text = " ".join(_filler(rng, city, year, t) for t in templates)
        if y + len(_wrap(text, font, width)) * step > bottom:
            return y
        y = _text_block(draw, (x, y), text, font, width) + font.size


def _table(
    draw: ImageDraw.ImageDraw,
    xy: tuple[float, float],
    rows: list[list[str]],
    widths: list[float],
    font: ImageFont.FreeTypeFont,
    bold: ImageFont.FreeTypeFont,
    header_fill: tuple[int, int, int],
) -> float:
    """A grid with a shaded header row; return the y below it."""
    x0, y = xy
    row_h = font.size * 1.9
    total_w = sum(widths)
    for r, row in enumerate(rows):
        if r == 0:
            draw.rectangle([x0, y, x0 + total_w, y + row_h], fill=header_fill)
        elif r % 2 == 0:
            draw.rectangle([x0, y, x0 + total_w, y + row_h], fill=(244, 244, 246))
        x = x0
        for c, cell in enumerate(row):
            draw.text(
                (x + font.size * 0.4, y + row_h * 0.2),
                cell,
                font=bold if r == 0 else font,
                fill=(20, 20, 20),
            )
            x += widths[c]
        y += row_h
        draw.line([x0, y, x0 + total_w, y], fill=(170, 170, 175), width=1)
    return y


def _chart(
    kind: str,
    labels: list[str],
    values: list[float],
    title: str,
    size: tuple[int, int],
    color: str,
) -> Image.Image:
    """A matplotlib chart rendered off-screen (Agg canvas, no pyplot state) as an RGB image."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = max(size[0], 40), max(size[1], 30)
    fig = Figure(figsize=(w / 100, h / 100), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    fs = max(3.0, min(w, h) / 28)
    if kind == "bar":
        ax.bar(labels, values, color=color)
    elif kind == "barh":
        ax.barh(labels, values, color=color)
    elif kind == "line":
        ax.plot(labels, values, marker="o", color=color, linewidth=max(1.0, fs / 6))
        ax.grid(alpha=0.3)
    elif kind == "pie":
        ax.pie(values, labels=labels, autopct="%1.0f%%", textprops={"fontsize": fs})
    else:
        raise ValueError(f"unknown chart kind {kind!r}")
    ax.set_title(title, fontsize=fs * 1.15)
    ax.tick_params(labelsize=fs)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tight_layout cannot always fit tiny test pages
        fig.tight_layout()
    canvas.draw()
    return Image.fromarray(np.asarray(canvas.buffer_rgba())[..., :3].copy())


# --- pages ------------------------------------------------------------------------------------


@dataclass
class _Fact:
    kind: str
    question: str
    answer: str


@dataclass
class _Page:
    kind: str
    title: str
    image: Image.Image
    facts: list[_Fact] = field(default_factory=list)


def _size(kind: str, scale: float, height: int | None = None) -> tuple[int, int]:
    w, h = BASE_SIZES[kind]
    h = height if height is not None else h
    return max(MIN_SIDE, round(w * scale)), max(MIN_SIDE, round(h * scale))


def _report(rng: random.Random, names: _Registry, scale: float) -> _Page:
    W, H = _size("report", scale)
    u = W / 100
    company = names.unique(rng, _company)
    project = names.unique(rng, _project)
    city, person, author = rng.choice(_CITIES), _person(rng), _person(rng)
    year = rng.randint(2016, 2024)
    title = f"{company} {rng.choice(_TOPICS)} {year}"
    img = Image.new("RGB", (W, H), (255, 255, 255))
    d = ImageDraw.Draw(img)
    small, body = _font("DejaVuSans", round(1.7 * u)), _font("DejaVuSans", round(2.1 * u))
    bold = _font("DejaVuSans-Bold", round(2.1 * u))
    m = 7 * u
    d.text((m, 3 * u), f"{company} - internal", font=small, fill=(110, 110, 120))
    d.line([m, 5.5 * u, W - m, 5.5 * u], fill=(40, 70, 140), width=max(1, round(0.3 * u)))
    y = _text_block(d, (m, 8 * u), title, _font("DejaVuSans-Bold", round(4 * u)), W - 2 * m)
    y = _text_block(d, (m, y + u), f"Prepared by {author}, {city}", small, W - 2 * m)
    facts = [_Fact("paragraph", f"Who led the {project} programme at {company}?", person)]
    sentences = [_filler(rng, city, year, t) for t in rng.sample(_FILLER, 3)]
    sentences.insert(rng.randint(0, 3), f"The {project} programme in {city} was led by {person}.")
    y = _text_block(d, (m, y + 2 * u), " ".join(sentences), body, W - 2 * m)

    metrics = rng.sample(_METRICS, 3)
    years = [year - 2, year - 1, year]
    rows = [["Metric", *map(str, years)]]
    values = {}
    for name, unit in metrics:
        base = rng.uniform(20, 900)
        vals = [round(base * rng.uniform(0.8, 1.25), 1) for _ in years]
        values[name] = (vals, unit)
        rows.append([f"{name} ({unit})", *(f"{v:,.1f}" for v in vals)])
    widths = [0.40 * (W - 2 * m)] + [0.20 * (W - 2 * m)] * 3
    y = _table(d, (m, y + 2 * u), rows, widths, body, bold, (214, 224, 245))
    name, unit = metrics[rng.randrange(3)]
    col = rng.randrange(3)
    v = values[name][0][col]
    facts.append(
        _Fact("table", f"What was the {name} of {company} in {years[col]}?", f"{v:,.1f} {unit}")
    )

    chart_h = round(min(H - y - 14 * u, 38 * u))
    if chart_h > 12 * u:
        cname, cunit = rng.choice([mt for mt in _METRICS if mt not in metrics])
        cyears = [str(year - k) for k in range(5, -1, -1)]
        cvals = rng.sample(range(20, 400), len(cyears))
        kind = rng.choice(["bar", "line"])
        chart = _chart(
            kind,
            cyears,
            cvals,
            f"{company}: {cname} ({cunit})",
            (round(W - 2 * m), chart_h),
            rng.choice(["#3b6fb6", "#c0504d", "#4f9a5a"]),
        )
        img.paste(chart, (round(m), round(y + 2 * u)))
        y += 2 * u + chart.height
        peak = cyears[int(np.argmax(cvals))]
        facts.append(_Fact("chart", f"In which year did {company}'s {cname} peak?", peak))
    _fill(d, rng, (m, y + 2 * u), H - 6 * u, body, W - 2 * m, city, year)
    d.text(
        (m, H - 4 * u),
        f"{company} | {year} | page {rng.randint(2, 40)}",
        font=small,
        fill=(120, 120, 120),
    )
    return _Page("report", title, img, facts)


def _slide(rng: random.Random, names: _Registry, scale: float) -> _Page:
    W, H = _size("slide", scale)
    u = H / 100
    project = names.unique(rng, _project)
    owner, quarter, year = _person(rng), f"Q{rng.randint(1, 4)}", rng.randint(2019, 2026)
    metric, unit = rng.choice(_METRICS)
    target = f"{rng.randint(12, 980)} {unit}"
    budget = f"{rng.randint(120, 4800):,} k EUR"
    title = f"Project {project}: {quarter} {year} plan"
    palette = rng.choice([(32, 60, 110), (110, 40, 60), (30, 90, 80), (70, 50, 120)])
    img = Image.new("RGB", (W, H), (250, 250, 252))
    d = ImageDraw.Draw(img)
    d.rectangle([0, 0, W, 16 * u], fill=palette)
    d.text((5 * u, 4 * u), title, font=_font("DejaVuSans-Bold", round(7 * u)), fill=(255, 255, 255))
    body = _font("DejaVuSans", round(4.2 * u))
    bullets = [
        f"Owner: {owner}",
        f"Target {metric}: {target} by {quarter} {year}",
        f"Approved budget: {budget}",
        _filler(rng, rng.choice(_CITIES), year),
    ]
    y = 22 * u
    for b in bullets:
        d.ellipse([5 * u, y + 1.2 * u, 6.6 * u, y + 2.8 * u], fill=palette)
        y = _text_block(d, (9 * u, y), b, body, W * 0.48) + 2 * u
    facts = [
        _Fact("bullet", f"Who owns Project {project}?", owner),
        _Fact("bullet", f"What is the {metric} target of Project {project}?", target),
        _Fact("bullet", f"What budget was approved for Project {project}?", budget),
    ]
    box = (round(W * 0.58), round(20 * u), round(W * 0.38), round(72 * u))
    if rng.random() < 0.6:
        labels = [f"{quarter[0]}{k}" for k in range(1, 5)] if rng.random() < 0.5 else _ADJ[:4]
        vals = [rng.randint(5, 60) for _ in labels]
        kind = rng.choice(["pie", "barh", "line"])
        img.paste(_chart(kind, labels, vals, f"{project}: {metric}", box[2:], "#4c72b0"), box[:2])
    else:
        kpi = f"{rng.randint(51, 99)}%"
        d.text(
            (box[0], box[1] + 10 * u),
            kpi,
            font=_font("DejaVuSans-Bold", round(22 * u)),
            fill=palette,
        )
        d.text((box[0], box[1] + 40 * u), "of milestones on schedule", font=body, fill=(60, 60, 60))
        facts.append(
            _Fact("kpi", f"What share of Project {project} milestones is on schedule?", kpi)
        )
    return _Page("slide", title, img, facts)


def _receipt(rng: random.Random, names: _Registry, scale: float) -> _Page:
    store = names.unique(rng, _store)
    city = rng.choice(_CITIES)
    date = f"{rng.randint(2019, 2025)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    items = rng.sample(_ITEMS, rng.randint(8, 20))
    lines = [
        (name, rng.randint(1, 3), round(price * rng.uniform(0.85, 1.3), 2)) for name, price in items
    ]
    W, H = _size("receipt", scale, height=300 + 34 * len(lines) + 300)
    u = W / 100
    img = Image.new("RGB", (W, H), (252, 251, 246))
    d = ImageDraw.Draw(img)
    mono = _font("DejaVuSansMono", round(4.3 * u))
    head = _font("DejaVuSansMono-Bold", round(6.5 * u))
    y = 6 * u
    for text, font in (
        (store.upper(), head),
        (f"{rng.randint(2, 199)} Harbour Rd, {city}", mono),
        (f"{date}  {rng.randint(7, 21):02d}:{rng.randint(0, 59):02d}", mono),
    ):
        d.text(((W - font.getlength(text)) / 2, y), text, font=font, fill=(20, 20, 20))
        y += font.size * 1.5
    chars = max(8, int((W - 8 * u) / max(1.0, mono.getlength("0"))))
    sep = "-" * chars
    d.text((4 * u, y), sep, font=mono, fill=(60, 60, 60))
    y += mono.size * 1.5
    total = 0.0
    for name, qty, price in lines:
        amount = qty * price
        total += amount
        left = f"{qty} x {name}"
        right = f"{amount:.2f}"
        d.text((4 * u, y), left, font=mono, fill=(20, 20, 20))
        d.text((W - 4 * u - mono.getlength(right), y), right, font=mono, fill=(20, 20, 20))
        y += mono.size * 1.45
    d.text((4 * u, y), sep, font=mono, fill=(60, 60, 60))
    y += mono.size * 1.5
    vat = total * 0.2 / 1.2
    for label, value, font in (
        ("VAT incl.", f"{vat:.2f}", mono),
        ("TOTAL EUR", f"{total:.2f}", head),
    ):
        d.text((4 * u, y), label, font=font, fill=(20, 20, 20))
        d.text((W - 4 * u - font.getlength(value), y), value, font=font, fill=(20, 20, 20))
        y += font.size * 1.6
    card = f"{rng.randint(0, 9999):04d}"
    d.text((4 * u, y), f"CARD **** {card}", font=mono, fill=(20, 20, 20))
    y += mono.size * 2.5
    x = 8 * u
    while x < W - 8 * u:  # a barcode-like strip
        bw = rng.choice([1, 1, 2, 3]) * max(1.0, u / 3)
        d.rectangle([x, y, x + bw, y + 14 * u], fill=(10, 10, 10))
        x += bw + rng.choice([1, 2, 3]) * max(1.0, u / 3)
    name, qty, price = rng.choice(lines)
    facts = [
        _Fact("total", f"What was the total on the {store} receipt from {date}?", f"{total:.2f}"),
        _Fact("item", f"How much did the {name} cost at {store} on {date}?", f"{qty * price:.2f}"),
        _Fact("card", f"Which card ending was used at {store} on {date}?", card),
    ]
    return _Page("receipt", f"{store} receipt {date}", img, facts)


def _datasheet(rng: random.Random, names: _Registry, scale: float) -> _Page:
    W, H = _size("datasheet", scale)
    u = W / 100
    company = names.unique(rng, _company)
    product = rng.choice(sorted(_PRODUCTS))
    attrs = _PRODUCTS[product]
    models = [names.unique(rng, _model_code) for _ in range(rng.randint(4, 7))]
    title = f"{company} {product} series - technical data"
    img = Image.new("RGB", (W, H), (255, 255, 255))
    d = ImageDraw.Draw(img)
    body, bold = _font("DejaVuSans", round(1.9 * u)), _font("DejaVuSans-Bold", round(1.6 * u))
    m = 5 * u
    y = _text_block(d, (m, 4 * u), title, _font("DejaVuSans-Bold", round(3.2 * u)), W - 2 * m)
    y = _text_block(d, (m, y + u), _filler(rng, rng.choice(_CITIES), 2024), body, W - 2 * m)
    rows = [["Model", *attrs]]
    table: dict[str, list[str]] = {}
    for model in models:
        cells = [f"{rng.uniform(1, 400):.1f}" for _ in attrs]
        table[model] = cells
        rows.append([model, *cells])
    widths = [0.16 * (W - 2 * m)] + [0.21 * (W - 2 * m)] * len(attrs)
    y = _table(d, (m, y + 2 * u), rows, widths, body, bold, (225, 235, 220))
    col = rng.randrange(len(attrs))
    chart_h = round(H - y - 6 * u)
    vals = [float(table[mdl][col]) for mdl in models]
    facts = [
        _Fact(
            "table",
            f"What is the {attrs[a]} of the {model} {product}?",
            table[model][a],
        )
        for model, a in [(rng.choice(models), rng.randrange(len(attrs)))]
    ]
    if chart_h > 10 * u:
        chart = _chart(
            "barh", models, vals, f"{company}: {attrs[col]}", (round(0.6 * W), chart_h), "#6a8f3a"
        )
        img.paste(chart, (round(m), round(y + 2 * u)))
        best = models[int(np.argmax(vals))]
        facts.append(
            _Fact("chart", f"Which {company} {product} model has the highest {attrs[col]}?", best)
        )
    return _Page("datasheet", title, img, facts)


_RENDERERS: dict[str, Callable[[random.Random, _Registry, float], _Page]] = {
    "report": _report,
    "slide": _slide,
    "receipt": _receipt,
    "datasheet": _datasheet,
}


def _kind_of(seed: int, index: int) -> str:
    """Kinds come in shuffled blocks of four, so any four consecutive pages cover all kinds."""
    block = list(KINDS)
    random.Random(f"{seed}/kinds/{index // len(KINDS)}").shuffle(block)
    return block[index % len(KINDS)]


def render_page(
    seed: int, index: int, scale: float = 1.0, registry: _Registry | None = None
) -> _Page:
    """Render page ``index`` of the set with ``seed`` (kind, title, image, facts)."""
    rng = random.Random(f"{seed}/page/{index}")
    return _RENDERERS[_kind_of(seed, index)](rng, registry or _Registry(), scale)


def make_docs(
    out: Path | str,
    n_pages: int,
    seed: int = 0,
    *,
    scale: float = 1.0,
    queries_per_page: tuple[int, int] = (1, 2),
) -> DocSet:
    """Generate a set into ``out`` (created, or replaced if it holds an earlier set).

    Args:
        out: Target directory; an existing non-empty directory must be an earlier set.
        n_pages: Number of pages (kinds rotate: report, slide, receipt, datasheet).
        seed: Everything is a function of it.
        scale: Page size factor (1.0: A4 at ~100 dpi, 1280x720 slides); tests use ~0.25.
        queries_per_page: Inclusive range of queries drawn from each page's facts.
    """
    if n_pages < 1:
        raise ValueError(f"n_pages must be at least 1, got {n_pages}")
    if not 0.05 <= scale <= 4:
        raise ValueError(f"scale must be within 0.05..4, got {scale}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if (
            not (out / "manifest.json").is_file()
            or FORMAT not in (out / "manifest.json").read_text()
        ):
            raise FileExistsError(f"{out} exists and is not a document set; refusing to replace it")
        shutil.rmtree(out)
    registry = _Registry()
    pages: list[tuple[DocEntry, Image.Image]] = []
    queries: list[QueryEntry] = []
    for i in range(n_pages):
        page = render_page(seed, i, scale, registry)
        doc_id = f"page-{i:04d}"
        pages.append(
            (
                DocEntry(
                    doc_id,
                    f"images/{doc_id}.png",
                    page.kind,
                    page.image.width,
                    page.image.height,
                    page.title,
                ),
                page.image,
            )
        )
        rng = random.Random(f"{seed}/queries/{i}")
        lo, hi = queries_per_page
        n_q = min(len(page.facts), rng.randint(lo, hi))
        for j, fact in enumerate(rng.sample(page.facts, n_q)):
            queries.append(
                QueryEntry(f"q-{i:04d}-{j}", fact.question, doc_id, fact.answer, fact.kind)
            )
    kinds = {k: sum(1 for d, _ in pages if d.kind == k) for k in KINDS}
    manifest = {
        "seed": seed,
        "n_pages": n_pages,
        "n_queries": len(queries),
        "scale": scale,
        "kinds": kinds,
        "generator": "vlembed eval make-docs",
    }
    return write_docset(out, manifest, pages, queries)
